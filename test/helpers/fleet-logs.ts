/**
 * Keeps what a failed fleet test leaves behind (the controllers' and agents' logs, the work
 * dir's other text files, and the clusters and nodes as a live controller tells them), since
 * `cleanup()` removes the work dir: a flake seen once in CI is then explainable afterwards.
 * Written under `$HERALD_KEEP_LOGS` (default `<tmpdir>/herald-kept-logs`), one dir per failure.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { TestFleet } from './fleet.js';
import { api, hasExited } from './procs.js';

/** Copies the fleet's logs and state to a new dir; resolves to its path. Never rejects. */
export async function keepFleetLogs(f: TestFleet | undefined, label: string): Promise<string | undefined> {
  if (!f) return undefined;
  try {
    const root = process.env.HERALD_KEEP_LOGS ?? path.join(os.tmpdir(), 'herald-kept-logs');
    const slug = label.replace(/[^a-z0-9]+/gi, '-').slice(0, 60);
    const dir = path.join(root, `${new Date().toISOString().replace(/[:.]/g, '-')}-${process.pid}-${slug}`);
    fs.mkdirSync(dir, { recursive: true });
    for (const name of fs.readdirSync(f.work)) {
      const p = path.join(f.work, name);
      if (fs.statSync(p).isFile() && /\.(log|out)$/.test(name)) fs.copyFileSync(p, path.join(dir, name));
    }
    const state: Record<string, unknown> = { at: new Date().toISOString() };
    for (const c of [...f.controllers.values()].sort((a, b) => a.name.localeCompare(b.name))) {
      if (hasExited(c.proc)) continue;
      const get = async (p: string) => {
        try {
          return (await api(c.port, f.op, 'GET', p)).json;
        } catch (err) {
          return { error: (err as Error).message };
        }
      };
      const clusters = (await get('/v1/clusters')) as { items?: Array<{ id: string }> };
      state[c.name] = {
        controllers: await get('/v1/controllers'),
        nodes: await get('/v1/nodes'),
        clusters: await Promise.all((clusters.items ?? []).map((x) => get(`/v1/clusters/${x.id}`))),
        deployments: await get('/v1/deployments'),
      };
    }
    fs.writeFileSync(path.join(dir, 'state.json'), JSON.stringify(state, null, 1));
    process.stderr.write(`fleet logs kept in ${dir}\n`);
    return dir;
  } catch (err) {
    process.stderr.write(`could not keep the fleet logs: ${(err as Error).message}\n`);
    return undefined;
  }
}

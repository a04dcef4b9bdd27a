/**
 * Real processes for the CLI tests: a PKI made by certs/, `bin/herald controller` and
 * `bin/herald agent` children on 127.0.0.1, and the CLI run as a child process. Needs `npm run
 * build` (bin/herald runs dist/).
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { initPki, issueCert } from '../../certs/pki.js';
import { clientFromOptions, type ApiClient } from '../../cli/operator/client.js';

export const HERALD_BIN = fileURLToPath(new URL('../../bin/herald', import.meta.url));

export const TEST_ENV = { ...process.env, HERALD_NO_CA_WARNING: '1', NO_COLOR: '1' };

export function tempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      s.close(() => (a && typeof a === 'object' ? resolve(a.port) : reject(new Error('no port'))));
    });
  });
}

export async function makePki(dir: string, agents: string[] = []): Promise<string> {
  const pki = path.join(dir, 'pki');
  await initPki({ dir: pki });
  await Promise.all(
    agents.map((name) => issueCert({ dir: pki, role: 'agent', name, dns: ['localhost'], ip: ['127.0.0.1'] })),
  );
  return pki;
}

export interface Proc {
  proc: ChildProcess;
  log: string;
  stop(): Promise<void>;
}

function startHerald(name: string, dir: string, args: string[]): Proc {
  const log = path.join(dir, `${name}.log`);
  const fd = fs.openSync(log, 'a');
  const proc = spawn(process.execPath, [HERALD_BIN, ...args], {
    stdio: ['ignore', fd, fd],
    env: TEST_ENV,
    detached: true,
  });
  fs.closeSync(fd);
  let exited = false;
  proc.on('exit', () => (exited = true));
  return {
    proc,
    log,
    async stop() {
      if (exited || proc.pid === undefined) return;
      const gone = new Promise<void>((r) => proc.once('exit', () => r()));
      try {
        process.kill(-proc.pid, 'SIGTERM');
      } catch {
        return;
      }
      const t = setTimeout(() => {
        try {
          process.kill(-proc.pid!, 'SIGKILL');
        } catch {
          // gone
        }
      }, 3_000);
      await gone;
      clearTimeout(t);
    },
  };
}

export interface Controller extends Proc {
  url: string;
  client: ApiClient;
}

export async function startController(dir: string, pki: string): Promise<Controller> {
  const port = await freePort();
  const url = `https://127.0.0.1:${port}`;
  const p = startHerald('controller', dir, [
    'controller',
    '--listen',
    `127.0.0.1:${port}`,
    '--pki',
    pki,
    '--db',
    path.join(dir, 'controller.db'),
  ]);
  const client = clientFromOptions({ controller: url, pki }, TEST_ENV);
  const deadline = Date.now() + 20_000;
  for (;;) {
    try {
      await client.get('/v1/nodes');
      break;
    } catch (err) {
      if (p.proc.exitCode !== null || Date.now() > deadline) {
        client.close();
        await p.stop();
        throw new Error(`controller did not start: ${(err as Error).message}\n${fs.readFileSync(p.log, 'utf8')}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  return {
    ...p,
    url,
    client,
    async stop() {
      client.close();
      await p.stop();
    },
  };
}

export async function startAgent(dir: string, pki: string, node: string, controllerUrl: string): Promise<Proc> {
  const port = await freePort();
  return startHerald(`agent-${node}`, dir, [
    'agent',
    '--node',
    node,
    '--controller',
    controllerUrl,
    '--listen',
    `127.0.0.1:${port}`,
    '--pki',
    pki,
    '--state-dir',
    path.join(dir, 'state', node),
    '--poll-interval',
    '30s',
  ]);
}

/** Waits until every node has announced an endpoint. */
export async function waitForNodes(client: ApiClient, nodes: string[], timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const body = await client.get<{ items?: { id?: string; endpoint?: unknown }[] }>('/v1/nodes');
    const ready = new Set((body.items ?? []).filter((n) => n.endpoint).map((n) => n.id));
    if (nodes.every((n) => ready.has(n))) return;
    if (Date.now() > deadline)
      throw new Error(`nodes not registered: ${nodes.filter((n) => !ready.has(n)).join(', ')}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `bin/herald ...args` to its end; `input` is written to its standard input. */
export function runCli(
  args: string[],
  opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; cwd?: string; input?: string } = {},
): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [HERALD_BIN, ...args],
      { env: opts.env ?? TEST_ENV, cwd: opts.cwd, timeout: opts.timeoutMs ?? 60_000, maxBuffer: 16 * 1024 * 1024 },
      (err, stdout, stderr) => {
        const code = err
          ? typeof (err as { code?: unknown }).code === 'number'
            ? (err as { code: number }).code
            : 1
          : 0;
        resolve({ code, stdout: stdout.toString(), stderr: stderr.toString() });
      },
    );
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
}

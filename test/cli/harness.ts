/**
 * Real processes for the CLI tests, through the testbed (cli/testbed/): a PKI made by certs/,
 * `bin/herald controller` and `bin/herald agent` children on 127.0.0.1, and the CLI run as a
 * child process. Needs `npm run build` (bin/herald runs dist/).
 */
import { execFile, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { clientFromOptions, type ApiClient } from '../../cli/operator/client.js';
import { startAgent as startTestbedAgent } from '../../cli/testbed/agent.js';
import { startController as startTestbedController } from '../../cli/testbed/controller.js';
import { makePki as makeTestbedPki } from '../../cli/testbed/pki.js';
import { freePort } from '../../cli/testbed/ports.js';
import { heraldBin, type HeraldProcess } from '../../cli/testbed/process.js';

export { freePort };

export const HERALD_BIN = heraldBin();

export const TEST_ENV = { ...process.env, HERALD_NO_CA_WARNING: '1', NO_COLOR: '1' };

export function tempDir(prefix: string): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

export async function makePki(dir: string, agents: string[] = []): Promise<string> {
  return (await makeTestbedPki(path.join(dir, 'pki'), { agents })).dir;
}

export interface Proc {
  proc: ChildProcess;
  log: string;
  stop(): Promise<void>;
}

/** SIGTERM to its group, SIGKILL after 3 s. */
function procOf(p: HeraldProcess): Proc {
  return {
    proc: p.child,
    log: p.logFile,
    async stop() {
      await p.stop('SIGTERM', 3_000);
    },
  };
}

export interface Controller extends Proc {
  url: string;
  client: ApiClient;
}

export async function startController(dir: string, pki: string): Promise<Controller> {
  const c = await startTestbedController({
    pki,
    db: path.join(dir, 'controller.db'),
    logFile: path.join(dir, 'controller.log'),
    env: TEST_ENV,
    timeoutMs: 20_000,
  });
  const client = clientFromOptions({ controller: c.url, pki }, TEST_ENV);
  const p = procOf(c.proc);
  return {
    ...p,
    url: c.url,
    client,
    async stop() {
      client.close();
      await p.stop();
    },
  };
}

export async function startAgent(dir: string, pki: string, node: string, controllerUrl: string): Promise<Proc> {
  const a = startTestbedAgent({
    node,
    pki,
    controllers: [controllerUrl],
    listen: `127.0.0.1:${await freePort()}`,
    stateDir: path.join(dir, 'state', node),
    pollInterval: '30s',
    logFile: path.join(dir, `agent-${node}.log`),
    env: TEST_ENV,
  });
  return procOf(a.proc);
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

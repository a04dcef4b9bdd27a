/**
 * A stock OpenStack node in the testbed (docs/development.md, "The testbed"): Debian's unmodified
 * os-collect-config, polling a metadata TempURL with its `request` collector, runs
 * os-refresh-config, which runs os-apply-config (heat-agents' templates) and heat-agents'
 * `55-heat-config`, whose `script` hook runs each deployment's script and whose
 * `heat-config-notify` PUTs the result to `deploy_signal_id`. The heat-agents files come
 * unmodified from a directory the caller names (the tests' and the benchmark's is
 * test/fixtures/heat-agents/, README.md there: they are not committed); only their paths are set,
 * through the environment variables they read, so the whole node lives in a temp dir.
 *
 *   const node = await startOccNode({ name: 'node1', heatAgentsDir, caFile, pollingIntervalS: 1 });
 *   await node.setMetadataUrl(url);   // the GET TempURL Heat minted (metadata's os-collect-config.request.metadata_url)
 *   await node.waitForFile('installed.txt');
 *   await node.stop();
 */
import { type ChildProcess, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
/** The openstack/heat-agents commit the files were taken from. */
export const HEAT_AGENTS_COMMIT = 'e1d9131ed7a933f9213c9626cc8b5a9907d0a10e';
/** The heat-agents files a node needs, at their upstream paths, with their git blob ids at HEAT_AGENTS_COMMIT. */
export const HEAT_AGENTS_FILES = {
  'heat-config/os-refresh-config/configure.d/55-heat-config': '15555c2fb735297778de9f95e075f9bef3ffcc23',
  'heat-config/bin/heat-config-notify': 'b3d4aad01fb54d32d4db10bbc843c22e93186c8f',
  'heat-config/os-apply-config/etc/os-collect-config.conf': '0206dd71d6a867f018b58195942cce8a6ed9c6e7',
  'heat-config/os-apply-config/var/run/heat-config/heat-config': 'cb7a927d8ac322a86b8f1b22fe1e669d4f42b2f1',
  'heat-config-script/install.d/hook-script.py': '133720ce79cf024940bfec82195ef2d71312abf2',
} as const;
type HeatAgentsFile = keyof typeof HEAT_AGENTS_FILES;

/** os-collect-config's own default `--polling-interval`. */
export const OCC_POLLING_INTERVAL_DEFAULT_S = 30;
const WAIT_TIMEOUT_DEFAULT_MS = 240_000;
const POLL_EVERY_MS = 100;

/** A stock node's PATH: Debian's alone, so the scripts' `#!/usr/bin/env python3` is /usr/bin/python3. */
const NODE_PATH = '/usr/sbin:/usr/bin:/sbin:/bin';

/** Git's blob id of a file's content (what `git hash-object` prints). */
function gitBlobId(content: Buffer): string {
  return crypto.createHash('sha1').update(`blob ${content.length}\0`).update(content).digest('hex');
}

/**
 * The heat-agents files missing from `heatAgentsDir` or not as upstream has them, each as
 * "path (missing)" or "path (changed)"; empty when the node can run.
 */
export function heatAgentsProblems(heatAgentsDir: string): string[] {
  const problems: string[] = [];
  for (const [rel, blob] of Object.entries(HEAT_AGENTS_FILES)) {
    let content: Buffer;
    try {
      content = fs.readFileSync(path.join(heatAgentsDir, rel));
    } catch {
      problems.push(`${rel} (missing)`);
      continue;
    }
    if (gitBlobId(content) !== blob) problems.push(`${rel} (changed)`);
  }
  return problems;
}

export interface OccNodeOptions {
  /** The node's name, for messages. */
  name: string;
  /** Where heat-agents' files are laid out, at their upstream paths (HEAT_AGENTS_FILES). */
  heatAgentsDir: string;
  /** The metadata GET TempURL to poll from the start, as a node booted with it configured; see setMetadataUrl(). */
  metadataUrl?: string;
  /** The CA the node trusts for the object store (REQUESTS_CA_BUNDLE: the request collector has no CA option). */
  caFile: string;
  /** Where the node lives; default a new temp dir. A dir given is left in place by stop(), one made here is removed. */
  dir?: string;
  /** os-collect-config's `--polling-interval` in seconds (default 30, its own); tests pass 1-2. */
  pollingIntervalS?: number;
}

export interface WaitOptions {
  timeoutMs?: number;
  /** Resolve only once the content passes this test (default: the file exists). */
  until?: (content: string) => boolean;
}

export interface OccNode {
  readonly name: string;
  /** The node's temp dir. */
  readonly dir: string;
  /** The node's "/": os-apply-config's output root; every path below mirrors a real node's under it. */
  readonly root: string;
  /** os-collect-config's config file (`<root>/etc/os-collect-config.conf`), rewritten by os-apply-config from Heat's metadata. */
  readonly configFile: string;
  /** 55-heat-config's record of what ran: `<config id>.json` (the deployment) and `<config id>.notify.json` (what it signalled). */
  readonly deployedDir: string;
  /** The `script` hook's working directory: where a deployment's script runs and writes relative paths. */
  readonly scriptWorkDir: string;
  /** Everything the node's processes print (os-collect-config, os-refresh-config, the hooks, heat-config-notify). */
  readonly logFile: string;
  /** The running os-collect-config's pid (its process group), undefined after stop(). */
  pid(): number | undefined;
  /** The end of the log, for a failure message. */
  logTail(lines?: number): string;
  /**
   * Resolves with a file's content once it exists (and passes `until`). A relative `file` is under
   * scriptWorkDir.
   * @throws Error on timeout, or when os-collect-config exited on its own, with the log's end
   */
  waitForFile(file: string, opts?: WaitOptions): Promise<string>;
  /** The notify record of one derived config (`<deployedDir>/<id>.notify.json`), undefined until it ran. */
  notifyResult(configId: string): Record<string, unknown> | undefined;
  /**
   * Points the node at a metadata URL, as an operator configures a deployed server: writes it into
   * os-collect-config's config file and restarts os-collect-config (a restart is a reboot: a pass
   * under way is cut off). No-op when the file already says so.
   */
  setMetadataUrl(url: string): Promise<void>;
  /** SIGKILLs the node's process group; removes the dir when this helper made it. Idempotent. */
  stop(): Promise<void>;
}

function nodeEnv(root: string, caFile: string): NodeJS.ProcessEnv {
  const r = (p: string): string => path.join(root, p);
  return {
    PATH: NODE_PATH,
    HOME: r('root'),
    LANG: 'C.UTF-8',
    TMPDIR: r('tmp'),
    PYTHONDONTWRITEBYTECODE: '1',
    NO_PROXY: '127.0.0.1,localhost',
    REQUESTS_CA_BUNDLE: caFile,
    // os-refresh-config and os-apply-config
    OS_REFRESH_CONFIG_BASE_DIR: r('usr/libexec/os-refresh-config'),
    OS_CONFIG_APPLIER_TEMPLATES: r('usr/libexec/os-apply-config/templates'),
    OS_CONFIG_FILES_PATH: r('var/lib/os-collect-config/os_config_files.json'),
    // heat-agents: 55-heat-config, hook-script.py
    HEAT_SHELL_CONFIG: r('var/run/heat-config/heat-config'),
    HEAT_CONFIG_DEPLOYED: r('var/lib/heat-config/deployed'),
    HEAT_CONFIG_DEPLOYED_OLD: r('var/run/heat-config/deployed'),
    HEAT_CONFIG_HOOKS: r('var/lib/heat-config/hooks'),
    HEAT_CONFIG_NOTIFY: r('usr/bin/heat-config-notify'),
    HEAT_SCRIPT_WORKING: r('var/lib/heat-config/heat-config-script'),
    HEAT_SCRIPT_OUTPUTS: r('var/run/heat-config/heat-config-script'),
  };
}

/** Copies a heat-agents file from `src` into the node, executable when `exec`. */
function install(src: string, root: string, from: HeatAgentsFile, to: string, exec: boolean): void {
  const dest = path.join(root, to);
  fs.mkdirSync(path.dirname(dest), { recursive: true });
  fs.copyFileSync(path.join(src, from), dest);
  fs.chmodSync(dest, exec ? 0o755 : 0o644);
}

/** What a deployed server's image carries: heat-agents' elements (from `src`) installed under `root`. */
function layOut(src: string, root: string): void {
  for (const d of ['root', 'tmp', 'etc', 'var/lib/os-collect-config', 'var/run', 'var/lib/heat-config'])
    fs.mkdirSync(path.join(root, d), { recursive: true });
  const orc = 'usr/libexec/os-refresh-config/configure.d';
  install(src, root, 'heat-config/os-refresh-config/configure.d/55-heat-config', `${orc}/55-heat-config`, true);
  install(src, root, 'heat-config/bin/heat-config-notify', 'usr/bin/heat-config-notify', true);
  install(src, root, 'heat-config-script/install.d/hook-script.py', 'var/lib/heat-config/hooks/script', true);
  const tpl = 'usr/libexec/os-apply-config/templates';
  install(
    src,
    root,
    'heat-config/os-apply-config/etc/os-collect-config.conf',
    `${tpl}/etc/os-collect-config.conf`,
    false,
  );
  install(
    src,
    root,
    'heat-config/os-apply-config/var/run/heat-config/heat-config',
    `${tpl}/var/run/heat-config/heat-config`,
    false,
  );
  // upstream's is `exec os-apply-config`, whose output root is `/`, settable only by --output
  fs.writeFileSync(
    path.join(root, orc, '20-os-apply-config'),
    `#!/bin/bash\nset -ue\n\nexec os-apply-config --output '${root}'\n`,
    { mode: 0o755 },
  );
}

/** os-collect-config's config as a deployed server boots with it (the shape heat-agents' template renders). */
function occConfig(metadataUrl: string | undefined): string {
  const lines = ['[DEFAULT]', 'command = os-refresh-config', 'collectors = request', ''];
  if (metadataUrl) lines.push('[request]', `metadata_url = ${metadataUrl}`, '');
  return lines.join('\n');
}

function tail(file: string, lines: number): string {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // gone already
  }
}

/**
 * Starts a stock node: lays it out in a temp dir and starts os-collect-config polling (not
 * --one-time). Resolves once the process is started; it polls nothing until it has a metadata URL.
 * @throws Error when heat-agents' files are missing or changed, or the CA file does not exist
 */
export async function startOccNode(opts: OccNodeOptions): Promise<OccNode> {
  const o = { pollingIntervalS: OCC_POLLING_INTERVAL_DEFAULT_S, ...opts };
  const problems = heatAgentsProblems(o.heatAgentsDir);
  if (problems.length > 0)
    throw new Error(
      `heat-agents' files in ${o.heatAgentsDir} are not usable (README.md there): ${problems.join(', ')}`,
    );
  if (!fs.existsSync(o.caFile)) throw new Error(`caFile ${o.caFile} does not exist`);
  if (!(o.pollingIntervalS > 0)) throw new Error(`pollingIntervalS must be positive, got ${o.pollingIntervalS}`);
  const owned = o.dir === undefined;
  const dir = o.dir ?? fs.mkdtempSync(path.join(os.tmpdir(), `herald-occ-${o.name}-`));
  const root = path.join(dir, 'root');
  if (root.includes("'")) throw new Error(`the node's dir must not contain a quote: ${dir}`);
  layOut(o.heatAgentsDir, root);
  const configFile = path.join(root, 'etc', 'os-collect-config.conf');
  const deployedDir = path.join(root, 'var', 'lib', 'heat-config', 'deployed');
  const scriptWorkDir = path.join(root, 'var', 'lib', 'heat-config', 'heat-config-script');
  const logFile = path.join(dir, 'os-collect-config.log');
  fs.writeFileSync(configFile, occConfig(o.metadataUrl));
  const env = nodeEnv(root, path.resolve(o.caFile));
  const args = [
    '--config-file',
    configFile,
    '--cachedir',
    path.join(root, 'var', 'lib', 'os-collect-config'),
    '--backup-cachedir',
    path.join(root, 'var', 'run', 'os-collect-config'),
    '--polling-interval',
    String(o.pollingIntervalS),
    '--command',
    `os-refresh-config --lockfile ${path.join(root, 'var', 'run', 'os-refresh-config.lock')}`,
    'request',
  ];

  let child: ChildProcess | undefined;
  let exited: Promise<void> = Promise.resolve();
  /** Set when os-collect-config exited without being told to. */
  let died: string | undefined;
  let stopped: Promise<void> | undefined;

  const logTail = (lines = 40): string => `--- ${logFile}\n${tail(logFile, lines)}`;

  const launch = (): void => {
    const fd = fs.openSync(logFile, 'a');
    const c = spawn('/usr/bin/os-collect-config', args, { cwd: root, detached: true, stdio: ['ignore', fd, fd], env });
    fs.closeSync(fd);
    child = c;
    died = undefined;
    exited = new Promise<void>((resolve) => {
      c.once('exit', (code, signal) => {
        if (child === c) died = `os-collect-config exited (${code ?? signal})`;
        resolve();
      });
      c.once('error', (e) => {
        if (child === c) died = `os-collect-config did not start: ${e.message}`;
        resolve();
      });
    });
  };

  const halt = async (): Promise<void> => {
    const c = child;
    child = undefined;
    if (c && c.exitCode === null && c.signalCode === null) killGroup(c.pid);
    await exited;
  };

  const stop = (): Promise<void> => {
    stopped ??= (async () => {
      await halt();
      if (owned) fs.rmSync(dir, { recursive: true, force: true });
    })();
    return stopped;
  };

  const waitForFile = async (file: string, w: WaitOptions = {}): Promise<string> => {
    const p = path.resolve(scriptWorkDir, file);
    const timeoutMs = w.timeoutMs ?? WAIT_TIMEOUT_DEFAULT_MS;
    const t0 = Date.now();
    for (;;) {
      let content: string | undefined;
      try {
        content = fs.readFileSync(p, 'utf8');
      } catch {
        // not yet
      }
      if (content !== undefined && (!w.until || w.until(content))) return content;
      if (died) throw new Error(`${o.name}: ${died} while waiting for ${p}:\n${logTail()}`);
      if (stopped) throw new Error(`${o.name}: stopped while waiting for ${p}`);
      if (Date.now() - t0 > timeoutMs)
        throw new Error(
          `${o.name}: ${p} ${content === undefined ? 'absent' : 'not as expected'} after ${timeoutMs} ms:\n${logTail()}`,
        );
      await new Promise((r) => setTimeout(r, POLL_EVERY_MS));
    }
  };

  const notifyResult = (configId: string): Record<string, unknown> | undefined => {
    try {
      return JSON.parse(fs.readFileSync(path.join(deployedDir, `${configId}.notify.json`), 'utf8')) as Record<
        string,
        unknown
      >;
    } catch {
      return undefined;
    }
  };

  const setMetadataUrl = async (url: string): Promise<void> => {
    if (stopped) throw new Error(`${o.name}: stopped`);
    if (/[\r\n]/.test(url)) throw new Error(`${o.name}: a metadata URL is one line`);
    if (fs.readFileSync(configFile, 'utf8').split('\n').includes(`metadata_url = ${url}`)) return;
    await halt();
    fs.writeFileSync(configFile, occConfig(url));
    launch();
  };

  launch();
  return {
    name: o.name,
    dir,
    root,
    configFile,
    deployedDir,
    scriptWorkDir,
    logFile,
    pid: () => child?.pid,
    logTail,
    waitForFile,
    notifyResult,
    setMetadataUrl,
    stop,
  };
}

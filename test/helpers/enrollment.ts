/**
 * What the enrolment suites share (docs/adding-nodes.md), on the testbed (cli/testbed/): a PKI
 * with the issuer `i1`, `bin/herald controller --issuer i1` processes, and the CLI as an operator
 * and a node run it: `herald enroll token`, `herald agent enroll`, and an enrolled agent started
 * from the PKI directory the enrolment wrote.
 *
 *   const e = await makeEnrolBed({ prefix: 'herald-revoke-', controllerArgs: ['--push-workers', '0', '--issuer', 'i1'] });
 *   const r = e.enroll('n1', e.token('n1'), path.join(e.work, 'node-n1'));
 *   afterAll(() => e.close());
 */
import fs from 'node:fs';
import path from 'node:path';
import { startAgent } from '../../cli/testbed/agent.js';
import { startController } from '../../cli/testbed/controller.js';
import { freePort } from '../../cli/testbed/ports.js';
import { Testbed } from '../../cli/testbed/testbed.js';
import { asProc, heraldSync, killAll, REPO, type Cred, type Proc } from './procs.js';

/** The issuing CA every enrolment bed holds. */
export const ISSUER = 'i1';

export interface CliRun {
  code: number | null;
  out: string;
  err: string;
}

export interface EnrolBed {
  /** The bed's directory (its processes' logs are here). */
  readonly work: string;
  readonly pki: string;
  readonly op: Cred;
  readonly ca: Buffer;
  /** The CA certificate's SHA-256 in lowercase hex, what `--ca-sha256` takes. */
  readonly fingerprint: string;
  /** The first controller's port. */
  readonly port: number;
  /** The first controller (started again by a test, replace it here). */
  ctl: Proc;
  /**
   * Starts `herald controller` with `args` (default the bed's `controllerArgs`), on `port`
   * (default the first controller's) and `db` (default `<work>/herald.db`); resolves once it is ready.
   */
  startController(args?: string[], port?: number, db?: string): Promise<Proc>;
  /**
   * `herald enroll token --node <node>` against the controller on `port`; its output.
   * @throws Error when it fails
   */
  token(node: string, extra?: string[], port?: number): string;
  /** `herald agent enroll` for `node` into `dir` with `token`, run to its end. */
  enroll(node: string, token: string, dir: string, o?: { fingerprint?: string; url?: string }): CliRun;
  /** `herald agent enroll`'s arguments (for a run that must not block this process). */
  enrollArgs(node: string, token: string, dir: string, o?: { fingerprint?: string; url?: string }): string[];
  /**
   * Starts the agent of `node` enrolled into `dir`, its state in `<work>/state-<node>`, knowing
   * the controller on `controllerPort` (default the first's); does not wait for it.
   */
  startAgent(node: string, dir: string, o?: { port?: number; controllerPort?: number }): Promise<Proc>;
  /** SIGKILLs every process of the test file and removes the directory. */
  close(): Promise<void>;
}

/**
 * Makes the PKI (with the issuer), picks a port and starts the first controller with
 * `controllerArgs` (`--issuer i1` and whatever else the suite needs).
 */
export async function makeEnrolBed(o: { prefix: string; controllerArgs: string[]; db?: string }): Promise<EnrolBed> {
  const bed = new Testbed({ prefix: o.prefix, cwd: REPO, keep: true });
  const pki = await bed.makePki({ issuers: [ISSUER] });
  const port = await freePort();
  const url = (p: number): string => `https://127.0.0.1:${p}`;
  let n = 0;
  const enrollArgs: EnrolBed['enrollArgs'] = (node, token, dir, a = {}) => [
    'agent',
    'enroll',
    '--controller',
    a.url ?? url(port),
    '--ca-sha256',
    a.fingerprint ?? e.fingerprint,
    '--token',
    token,
    '--node',
    node,
    '--pki',
    dir,
  ];
  const e: EnrolBed = {
    work: bed.dir,
    pki: pki.dir,
    op: pki.operator(),
    ca: fs.readFileSync(pki.paths.caCrt),
    fingerprint: pki.caSha256(),
    port,
    ctl: undefined as unknown as Proc,
    async startController(args = o.controllerArgs, p = port, db = o.db ?? path.join(bed.dir, 'herald.db')) {
      let proc: Proc | undefined;
      const label = `controller-${n++}`;
      await startController({
        label,
        pki: pki.dir,
        db,
        port: p,
        args,
        logFile: path.join(bed.dir, `${label}.log`),
        cwd: REPO,
        timeoutMs: 20_000,
        onStart: (h) => {
          proc = asProc(h);
        },
      });
      return proc!;
    },
    token(node, extra = [], p = port) {
      const r = heraldSync(['enroll', 'token', '--node', node, '--controller', url(p), '--pki', pki.dir, ...extra]);
      if (r.code !== 0) throw new Error(`herald enroll token --node ${node}: exit ${r.code}: ${r.err}`);
      return r.out.trim();
    },
    enroll: (node, token, dir, a) => heraldSync(enrollArgs(node, token, dir, a)),
    enrollArgs,
    async startAgent(node, dir, a = {}) {
      const label = `agent-${node}`;
      const agent = startAgent({
        node,
        label,
        pki: dir,
        controllers: [url(a.controllerPort ?? port)],
        listen: `127.0.0.1:${a.port ?? (await freePort())}`,
        stateDir: path.join(bed.dir, `state-${node}`),
        logFile: path.join(bed.dir, `${label}.log`),
        cwd: REPO,
      });
      return asProc(agent.proc);
    },
    async close() {
      await killAll();
      fs.rmSync(bed.dir, { recursive: true, force: true });
    },
  };
  e.ctl = await e.startController();
  return e;
}

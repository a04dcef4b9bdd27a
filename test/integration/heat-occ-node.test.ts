/**
 * The stock-node helper (test/helpers/occ-node.ts) proven against real Heat: unmodified Heat and
 * the unmodified `openstack` CLI create and update a DeployedServer stack (POLL_TEMP_URL +
 * TEMP_URL_SIGNAL) whose install deployment is run by Debian's unmodified os-collect-config,
 * os-refresh-config and os-apply-config with heat-agents' unmodified hook and notifier. Nothing
 * else signals: the stack completes only when the node did its work. The object store is the
 * recording TEST DOUBLE (test/helpers/recording-object-store.ts), which records TempURL signatures
 * but does not enforce them.
 *
 * How the node learns its metadata URL: Heat mints the GET TempURL while it creates the
 * DeployedServer and writes it into the node's first metadata object
 * (`os-collect-config.request.metadata_url`, PUT with a token before any deployment); the test
 * reads it from the double's stored object and hands it to the node (setMetadataUrl), as an
 * operator configures a deployed server. HERALD_HEAT_TRACE=<file> writes what the double recorded.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initPki } from '../../certs/pki.js';
import { pkiPaths } from '../../certs/paths.js';
import {
  HEAT_FIXTURE_DIR,
  HEAT_PACKAGES,
  heatAvailable,
  startHeat,
  type Heat,
  type OpenstackResult,
} from '../helpers/heat.js';
import { HEAT_AGENTS_DIR, heatAgentsProblems, type OccNode, startOccNode } from '../helpers/occ-node.js';
import { type RecordingObjectStore, startRecordingObjectStore } from '../helpers/recording-object-store.js';

const heatHere = heatAvailable();
const agentProblems = heatHere ? heatAgentsProblems() : [];
const available = heatHere && agentProblems.length === 0;
if (!heatHere)
  console.log(
    `heat-occ-node: skipped, OpenStack Heat is not installed (apt-get install --no-install-recommends ${HEAT_PACKAGES.join(' ')})`,
  );
else if (!available)
  console.log(
    `heat-occ-node: skipped, heat-agents' files are not laid out in ${HEAT_AGENTS_DIR} (see README.md there): ${agentProblems.join(', ')}`,
  );

const TEMPLATE = path.join(HEAT_FIXTURE_DIR, 'occ-node.yaml');
const CONTAINER = 'herald-occ1';
const STACK = 'o1';
/** Heat's steps on a loaded 2-core machine: each `openstack` call alone costs seconds. */
const STEP_TIMEOUT_MS = 240_000;
/** How long the node may take to run a deployment Heat has pushed: shorter than a step, to say why. */
const NODE_RUN_TIMEOUT_MS = 180_000;
/** The node's --polling-interval: a test needs no 30 s waits. */
const POLLING_INTERVAL_S = 1;
/** Where a stock node keeps its state; the helper's node must leave them alone. */
const STOCK_PATHS = [
  '/etc/os-collect-config.conf',
  '/var/lib/os-collect-config',
  '/var/run/os-collect-config',
  '/var/run/os-refresh-config.lock',
  '/var/lib/heat-config',
  '/var/run/heat-config',
];

interface HeatMetadata {
  deployments: { id: string; name: string; inputs: { name: string; value?: unknown }[] }[];
  'os-collect-config'?: { request?: { metadata_url?: string } };
}

const storedMetadata = (store: RecordingObjectStore): HeatMetadata | undefined => {
  const o = store.object(CONTAINER, 'metadata.json');
  return o ? (JSON.parse(o.body.toString('utf8')) as HeatMetadata) : undefined;
};

/**
 * The metadata GET TempURL Heat wrote into the node's metadata object, polled for while `cli`
 * runs; fails at once when the command ends first.
 */
async function metadataUrlDuring(store: RecordingObjectStore, cli: Promise<OpenstackResult>, heat: Heat) {
  let ended: OpenstackResult | undefined;
  void cli.then((r) => (ended = r));
  const t0 = Date.now();
  for (;;) {
    const url = storedMetadata(store)?.['os-collect-config']?.request?.metadata_url;
    if (url) return url;
    if (ended)
      throw new Error(
        `openstack ended (${ended.code}) before the metadata object:\n${ended.stderr}\n${heat.logTail()}`,
      );
    if (Date.now() - t0 > STEP_TIMEOUT_MS)
      throw new Error(`no metadata object in ${STEP_TIMEOUT_MS} ms:\n${heat.logTail()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The JSON document of `openstack stack create|update --wait -f json`, after its event lines. */
function stackJson(stdout: string): Record<string, unknown> | undefined {
  try {
    return JSON.parse(stdout.slice(stdout.search(/^\{/m))) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

describe.skipIf(!available)(
  'a stock os-collect-config + heat-agents node against real Heat',
  { timeout: STEP_TIMEOUT_MS },
  () => {
    let pkiDir: string;
    let store: RecordingObjectStore;
    let heat: Heat;
    let node: OccNode;
    let deploymentId = '';
    let signalPath = '';
    const stockBefore = new Map<string, boolean>();

    beforeAll(async () => {
      for (const p of STOCK_PATHS) stockBefore.set(p, fs.existsSync(p));
      pkiDir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-occ-pki-'));
      await initPki({ dir: pkiDir });
      const p = pkiPaths(pkiDir);
      store = await startRecordingObjectStore({
        cert: fs.readFileSync(p.cert('controller', 'controller')),
        key: fs.readFileSync(p.key('controller', 'controller')),
      });
      heat = await startHeat({ objectStoreUrl: store.url, caFile: p.caCrt });
      // booted without a metadata URL: Heat mints it during the stack create
      node = await startOccNode({ name: 'occ1', caFile: p.caCrt, pollingIntervalS: POLLING_INTERVAL_S });
    }, STEP_TIMEOUT_MS);

    afterAll(async () => {
      await node?.stop();
      await heat?.stop();
      await store?.close();
      if (pkiDir) fs.rmSync(pkiDir, { recursive: true, force: true });
      const trace = process.env.HERALD_HEAT_TRACE;
      if (trace && store) fs.writeFileSync(trace, `${JSON.stringify({ requests: store.requests }, null, 1)}\n`);
    });

    const failure = (r: OpenstackResult): string => `${r.stderr}\n${heat.logTail()}\n${node.logTail()}`;

    const openstackJson = async (args: string[]): Promise<Record<string, any>> => {
      const r = await heat.openstack([...args, '-f', 'json']);
      expect(r.code, failure(r)).toBe(0);
      return JSON.parse(r.stdout) as Record<string, any>;
    };

    const output = async (name: string): Promise<string> => {
      const r = await heat.openstack(['software', 'deployment', 'output', 'show', deploymentId, name]);
      expect(r.code, failure(r)).toBe(0);
      return r.stdout;
    };

    /** The derived config the node was last given, from the metadata object Heat last wrote. */
    const currentConfigId = (): string => storedMetadata(store)!.deployments[0]!.id;

    it('creates the stack: the node runs the script, signals through heat-config-notify, CREATE_COMPLETE', async () => {
      const create = heat.openstack(['stack', 'create', '--wait', '--poll', '1', '-t', TEMPLATE, '-f', 'json', STACK]);
      const url = await metadataUrlDuring(store, create, heat);
      expect(new URL(url).searchParams.get('temp_url_sig')).toMatch(/^[0-9a-f]{64}$/);
      await node.setMetadataUrl(url);
      // fails with the node's log when the node never runs the script (the create alone would hang)
      await node.waitForFile('installed.txt', { timeoutMs: NODE_RUN_TIMEOUT_MS });
      const r = await create;
      expect(r.code, failure(r)).toBe(0);
      expect(stackJson(r.stdout)?.stack_status).toBe('CREATE_COMPLETE');

      // the script ran on the node, in the script hook's working directory
      expect(fs.readFileSync(path.join(node.scriptWorkDir, 'installed.txt'), 'utf8')).toBe('world 0\n');
      // os-apply-config rendered heat-agents' templates from the metadata: os-collect-config's own
      // config now names what Heat put there
      expect(fs.readFileSync(node.configFile, 'utf8')).toContain(`metadata_url = ${url}`);

      const configId = currentConfigId();
      expect(node.notifyResult(configId)).toMatchObject({
        deploy_status_code: 0,
        deploy_stdout: 'installing for world\n',
        result: 'installed for world, trigger 0',
      });
      // the result reached the store as heat-config-notify sends it: a TempURL PUT by python-requests
      const deployment = storedMetadata(store)!.deployments[0]!;
      const signalUrl = String(deployment.inputs.find((i) => i.name === 'deploy_signal_id')?.value);
      signalPath = decodeURIComponent(new URL(signalUrl).pathname);
      const signals = store.requests.filter((q) => q.method === 'PUT' && q.path === signalPath && q.status === 201);
      expect(signals.map((q) => q.auth)).toContain('temp_url_sig');
      const signal = signals.find((q) => q.auth === 'temp_url_sig')!;
      expect(signal.headers['user-agent']).toMatch(/^python-requests\//);
      expect(signal.headers['content-type']).toBe('application/json');
      expect(JSON.parse(signal.body ?? '')).toMatchObject({ deploy_status_code: 0 });

      deploymentId = (await openstackJson(['stack', 'resource', 'show', STACK, 'install'])).physical_resource_id;
      expect(deploymentId).toMatch(/^[0-9a-f-]{36}$/);
      expect(await output('result')).toContain('installed for world, trigger 0');
    });

    it('a parameter update re-runs the script on the node: UPDATE_COMPLETE with the new output', async () => {
      const before = currentConfigId();
      const r = await heat.openstack([
        'stack',
        'update',
        '--existing',
        '--parameter',
        'restart_trigger=1',
        '--wait',
        '-f',
        'json',
        STACK,
      ]);
      expect(r.code, failure(r)).toBe(0);
      expect(stackJson(r.stdout)?.stack_status).toBe('UPDATE_COMPLETE');
      const configId = currentConfigId();
      expect(configId).not.toBe(before);
      expect(node.notifyResult(configId)).toMatchObject({
        deploy_status_code: 0,
        result: 'installed for world, trigger 1',
      });
      expect(fs.readFileSync(path.join(node.scriptWorkDir, 'installed.txt'), 'utf8')).toBe('world 1\n');
      expect(await output('result')).toContain('installed for world, trigger 1');
    });

    it('a failing script fails the stack, its stderr visible in stack show and deployment show', async () => {
      const r = await heat.openstack(['stack', 'update', '--existing', '--parameter', 'fail=yes', '--wait', STACK]);
      expect(r.code, `the update should fail:\n${r.stdout}`).not.toBe(0);
      const configId = currentConfigId();
      expect(node.notifyResult(configId)).toMatchObject({ deploy_status_code: 1 });

      const stack = await openstackJson(['stack', 'show', STACK]);
      expect(stack.stack_status).toBe('UPDATE_FAILED');
      expect(stack.stack_status_reason).toMatch(/non-zero status code: 1/);
      const outputs = stack.outputs as { output_key: string; output_value: unknown }[];
      expect(String(outputs.find((x) => x.output_key === 'deploy_stderr')?.output_value)).toContain(
        'install failed for world: the disk is full',
      );

      const d = await openstackJson(['software', 'deployment', 'show', '--long', deploymentId]);
      expect(d.status).toBe('FAILED');
      expect(d.output_values).toMatchObject({ deploy_status_code: 1 });
      expect(d.output_values.deploy_stderr).toContain('install failed for world: the disk is full');
      // the script stopped before writing: the last good run's file stays
      expect(fs.readFileSync(path.join(node.scriptWorkDir, 'installed.txt'), 'utf8')).toBe('world 1\n');
    });

    it('stop() leaves no process and no directory, and nothing was written to the stock paths', async () => {
      const pid = node.pid()!;
      const { dir } = node;
      await node.stop();
      expect(fs.existsSync(dir)).toBe(false);
      expect(() => process.kill(-pid, 0)).toThrow();
      for (const p of STOCK_PATHS) expect(fs.existsSync(p), p).toBe(stockBefore.get(p));
    });
  },
);

/**
 * The real-Heat fixture (test/helpers/heat.ts, test/fixtures/heat/) proven end to end: unmodified
 * Heat and the unmodified `openstack` CLI create, update and delete a DeployedServer stack with an
 * install SoftwareDeployment (POLL_TEMP_URL + TEMP_URL_SIGNAL) against an HTTPS object store that
 * presents a certificate made by certs/. The object store here is a TEST DOUBLE that records what
 * Heat asks of it (test/helpers/recording-object-store.ts); it exists to prove the fixture and to
 * measure Heat (docs/heat-object-store.md), not to stand in for Herald's own object store.
 * HERALD_HEAT_TRACE=<file> writes what it recorded.
 */
import fs from 'node:fs';
import https from 'node:https';
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
import { ACCOUNT, type RecordingObjectStore, startRecordingObjectStore } from '../helpers/recording-object-store.js';

const available = heatAvailable();
if (!available)
  console.log(
    `heat-fixture: skipped, OpenStack Heat is not installed (apt-get install --no-install-recommends ${HEAT_PACKAGES.join(' ')})`,
  );

const TEMPLATE = path.join(HEAT_FIXTURE_DIR, 'deployed-server.yaml');
/** Heat's steps on a loaded 2-core machine: each `openstack` call alone costs seconds. */
const STEP_TIMEOUT_MS = 240_000;

// ---- what the test reads in Heat's metadata ------------------------------------------------------

interface HeatInput {
  name: string;
  value?: unknown;
}
interface HeatDeploymentItem {
  id: string;
  name: string;
  group: string;
  config: string;
  inputs: HeatInput[];
}
interface HeatMetadata {
  deployments: HeatDeploymentItem[];
  'os-collect-config'?: { request?: { metadata_url?: string } };
}

const input = (d: HeatDeploymentItem, name: string): unknown => d.inputs.find((i) => i.name === name)?.value;

/** The TempURL PUTs of the node's metadata recorded from index `from` on. */
const metadataPuts = (store: RecordingObjectStore, from: number): HeatMetadata[] =>
  store.requests
    .slice(from)
    .filter(
      (r) => r.method === 'PUT' && r.auth === 'temp_url_sig' && r.path === `${ACCOUNT}/herald-node1/metadata.json`,
    )
    .map((r) => JSON.parse(r.body ?? '') as HeatMetadata);

/**
 * Polls the recorder for the first metadata PUT with a deployment from index `from` on, while
 * `cli` runs; fails at once when the command ends first, with what it printed.
 */
async function metadataPutDuring(
  store: RecordingObjectStore,
  from: number,
  cli: Promise<OpenstackResult>,
  heat: Heat,
): Promise<HeatMetadata> {
  let ended: OpenstackResult | undefined;
  void cli.then((r) => (ended = r));
  const t0 = Date.now();
  for (;;) {
    const md = metadataPuts(store, from).find((m) => m.deployments.length > 0);
    if (md) return md;
    if (ended)
      throw new Error(`openstack ended (${ended.code}) before the metadata PUT:\n${ended.stderr}\n${heat.logTail()}`);
    if (Date.now() - t0 > STEP_TIMEOUT_MS)
      throw new Error(`no metadata PUT in ${STEP_TIMEOUT_MS} ms:\n${heat.logTail()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** PUTs a result to `deploy_signal_id` as heat-agents' heat-config-notify does. */
function notify(signalUrl: string, ca: Buffer, result: Record<string, unknown>): Promise<number> {
  const body = Buffer.from(JSON.stringify(result));
  return new Promise((resolve, reject) => {
    const req = https.request(
      signalUrl,
      {
        method: 'PUT',
        ca,
        agent: false,
        headers: { 'content-type': 'application/json', 'content-length': String(body.length) },
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** `stack_status` of `openstack stack create|update --wait -f json`: its event lines, then the stack as JSON. */
function stackStatus(stdout: string): string | undefined {
  try {
    return (JSON.parse(stdout.slice(stdout.search(/^\{/m))) as { stack_status?: string }).stack_status;
  } catch {
    return undefined;
  }
}

describe.skipIf(!available)(
  'the real-Heat fixture against a recording object store',
  { timeout: STEP_TIMEOUT_MS },
  () => {
    let pkiDir: string;
    let ca: Buffer;
    let store: RecordingObjectStore;
    let heat: Heat;
    let signalUrl = '';
    let firstConfigId = '';
    const timings: Record<string, number> = {};

    beforeAll(async () => {
      pkiDir = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-heat-pki-'));
      await initPki({ dir: pkiDir });
      const p = pkiPaths(pkiDir);
      ca = fs.readFileSync(p.caCrt);
      // the controller's own server certificate (SANs 127.0.0.1, localhost); Heat sends no client certificate
      store = await startRecordingObjectStore({
        cert: fs.readFileSync(p.cert('controller', 'controller')),
        key: fs.readFileSync(p.key('controller', 'controller')),
      });
      const t0 = Date.now();
      heat = await startHeat({ objectStoreUrl: store.url, caFile: p.caCrt });
      timings.heatStartMs = Date.now() - t0;
    }, STEP_TIMEOUT_MS);

    afterAll(async () => {
      await heat?.stop();
      await store?.close();
      if (pkiDir) fs.rmSync(pkiDir, { recursive: true, force: true });
      const trace = process.env.HERALD_HEAT_TRACE;
      if (trace && store)
        fs.writeFileSync(trace, `${JSON.stringify({ timings, requests: store.requests }, null, 1)}\n`);
    });

    it('creates the stack: the metadata arrives through a TempURL, a signal completes it', async () => {
      const t0 = Date.now();
      const create = heat.openstack(['stack', 'create', '--wait', '--poll', '1', '-t', TEMPLATE, '-f', 'json', 'h1']);
      const md = await metadataPutDuring(store, 0, create, heat);
      timings.createToMetadataPutMs = Date.now() - t0;
      const d = md.deployments[0]!;
      expect(d).toMatchObject({ name: 'install', group: 'script' });
      expect(d.config).toContain('installing for $greeting');
      expect(input(d, 'greeting')).toBe('world');
      expect(input(d, 'restart_trigger')).toBe('0');
      expect(input(d, 'deploy_action')).toBe('CREATE');
      expect(input(d, 'deploy_signal_transport')).toBe('TEMP_URL_SIGNAL');
      expect(input(d, 'deploy_signal_verb')).toBe('PUT');
      signalUrl = String(input(d, 'deploy_signal_id'));
      expect(signalUrl.startsWith(`${store.url}/`)).toBe(true);
      expect(new URL(signalUrl).searchParams.get('temp_url_sig')).toMatch(/^[0-9a-f]{64}$/);
      expect(md['os-collect-config']?.request?.metadata_url).toMatch(/temp_url_sig=/);
      firstConfigId = d.id;
      // every TempURL Heat used is HMAC-SHA256 under the key it POSTed to the account
      const tempUrls = store.requests.filter((r) => r.auth === 'temp_url_sig');
      expect(tempUrls.map((r) => r.sigAlg)).toEqual(tempUrls.map(() => 'hmac-sha256'));

      expect(
        await notify(signalUrl, ca, {
          deploy_stdout: 'installing for world\n',
          deploy_stderr: '',
          deploy_status_code: 0,
          result: 'installed for world',
        }),
      ).toBe(201);
      const r = await create;
      timings.createMs = Date.now() - t0;
      expect(r.code, `${r.stderr}\n${heat.logTail()}`).toBe(0);
      expect(stackStatus(r.stdout)).toBe('CREATE_COMPLETE');

      const out = await heat.openstack(['stack', 'output', 'show', 'h1', 'result', '-f', 'json']);
      expect(out.code, out.stderr).toBe(0);
      expect(JSON.parse(out.stdout)).toMatchObject({ output_value: 'installed for world' });
    });

    it('a parameter update PUTs new metadata for the same signal object, and a signal completes it', async () => {
      const from = store.requests.length;
      const t0 = Date.now();
      const update = heat.openstack([
        'stack',
        'update',
        '--existing',
        '--parameter',
        'restart_trigger=1',
        '--wait',
        '-f',
        'json',
        'h1',
      ]);
      const md = await metadataPutDuring(store, from, update, heat);
      timings.updateToMetadataPutMs = Date.now() - t0;
      const d = md.deployments[0]!;
      expect(input(d, 'deploy_action')).toBe('UPDATE');
      expect(input(d, 'restart_trigger')).toBe('1');
      expect(input(d, 'deploy_signal_id')).toBe(signalUrl);
      expect(d.id).not.toBe(firstConfigId);

      expect(
        await notify(signalUrl, ca, {
          deploy_stdout: 'installing for world\n',
          deploy_stderr: '',
          deploy_status_code: 0,
          result: 'installed again',
        }),
      ).toBe(201);
      const r = await update;
      timings.updateMs = Date.now() - t0;
      expect(r.code, `${r.stderr}\n${heat.logTail()}`).toBe(0);
      expect(stackStatus(r.stdout)).toBe('UPDATE_COMPLETE');
      expect(metadataPuts(store, from)).toHaveLength(1);
    });

    it('deletes the stack: empty metadata is PUT, the signal object and its container are removed', async () => {
      const from = store.requests.length;
      const t0 = Date.now();
      const r = await heat.openstack(['stack', 'delete', '--yes', '--wait', 'h1']);
      timings.deleteMs = Date.now() - t0;
      expect(r.code, `${r.stderr}\n${heat.logTail()}`).toBe(0);
      expect(metadataPuts(store, from).map((m) => m.deployments)).toEqual([[]]);
      const signalPath = decodeURIComponent(new URL(signalUrl).pathname);
      const deleted = store.requests.slice(from).filter((q) => q.method === 'DELETE' && q.status === 204);
      expect(deleted.map((q) => q.path)).toContain(signalPath);
      expect(deleted.map((q) => q.path)).toContain(path.posix.dirname(signalPath));
    });

    it('stop() leaves no process and no directory behind', async () => {
      const { pid, dir } = heat;
      await heat.stop();
      expect(fs.existsSync(dir)).toBe(false);
      expect(() => process.kill(-pid, 0)).toThrow();
    });
  },
);

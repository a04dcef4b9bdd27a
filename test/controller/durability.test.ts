/**
 * A real `bin/herald controller` is SIGKILLed right after it acknowledged a change and a signal,
 * then started again on the same database: everything is intact, the generation included.
 * Also: graceful SIGTERM, and start-up mistakes named by option. Needs `npm run build`.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newNonce, verifyMetadataResponse } from '../../protocol/metadata.js';
import { makeControllerTestPki, type ControllerTestPki } from '../helpers/controller-pki.js';
import { request } from '../helpers/controller-harness.js';
import { controllerBuilt, HERALD, REPO, startControllerProcess } from '../helpers/controller-process.js';

let pki: ControllerTestPki;
let work: string;

beforeAll(async () => {
  if (!controllerBuilt()) throw new Error('run `npm run build` first: this suite starts bin/herald');
  pki = await makeControllerTestPki();
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'herald-ctl-dur-'));
});

afterAll(() => {
  pki?.cleanup();
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

describe('durability across SIGKILL', () => {
  it('keeps every acknowledged change, signal and the generation', async () => {
    const db = path.join(work, 'kill.db');
    const log = path.join(work, 'kill.log');
    const op = pki.cred('operator', 'admin');
    const n1 = pki.cred('agent', 'n1');
    let c = await startControllerProcess(['--pki', pki.dir, '--db', db], log);

    expect(
      (await request(c.port, n1, 'PUT', '/v1/nodes/n1/endpoint', { url: 'wss://127.0.0.1:9/v1/wake' })).status,
    ).toBe(200);
    const cfg = await request(c.port, op, 'POST', '/v1/configs', {
      name: 'c',
      group: 'script',
      config: 'x',
      inputs: [{ name: 'pw', hidden: true }],
      outputs: [{ name: 'x' }],
    });
    const dep = await request(c.port, op, 'POST', '/v1/deployments', {
      node: 'n1',
      config_id: cfg.json.id,
      input_values: { pw: 'secret-value' },
    });
    expect(dep.status).toBe(201);
    const sig = await request(c.port, n1, 'POST', `/v1/nodes/n1/deployments/${dep.json.id}/signal`, {
      revision: 1,
      deploy_status_code: 0,
      deploy_stdout: 'ok',
      deploy_stderr: '',
      outputs: { x: 'y' },
    });
    expect(sig.status).toBe(200);
    // a second deployment left in progress, then a new revision of it
    const dep2 = await request(c.port, op, 'POST', '/v1/deployments', {
      node: 'n1',
      config_id: cfg.json.id,
      name: 'second',
    });
    const patched = await request(c.port, op, 'PATCH', `/v1/deployments/${dep2.json.id}`, {
      input_values: { pw: 'other' },
    });
    expect(patched.json.revision).toBe(2);
    const before = {
      dep: (await request(c.port, op, 'GET', `/v1/deployments/${dep.json.id}`)).json,
      dep2: (await request(c.port, op, 'GET', `/v1/deployments/${dep2.json.id}`)).json,
      node: (await request(c.port, op, 'GET', '/v1/nodes/n1')).json,
      md: await request(c.port, n1, 'GET', '/v1/nodes/n1/metadata'),
    };
    expect(before.dep).toMatchObject({ status: 'COMPLETE', output_values: { x: 'y', deploy_stdout: 'ok' } });

    const end = await c.kill('SIGKILL');
    expect(end.signal).toBe('SIGKILL');

    c = await startControllerProcess(['--pki', pki.dir, '--db', db], log);
    try {
      const after = {
        dep: (await request(c.port, op, 'GET', `/v1/deployments/${dep.json.id}`)).json,
        dep2: (await request(c.port, op, 'GET', `/v1/deployments/${dep2.json.id}`)).json,
        node: (await request(c.port, op, 'GET', '/v1/nodes/n1')).json,
      };
      expect(after.dep).toEqual(before.dep);
      expect(after.dep2).toEqual(before.dep2);
      expect(after.node.generation).toBe(before.node.generation);
      expect(after.node.endpoint).toBe('wss://127.0.0.1:9/v1/wake');
      const nonce = newNonce();
      const md = await request(c.port, n1, 'GET', '/v1/nodes/n1/metadata', undefined, {
        headers: { 'herald-nonce': nonce },
      });
      expect(md.headers.etag).toBe(before.md.headers.etag);
      const v = verifyMetadataResponse({
        status: 200,
        signature: md.headers['herald-signature'] as string,
        body: md.raw,
        nonce,
        audience: pki.spiffe('agent', 'n1'),
        issuer: pki.spiffe('controller', 'controller'),
        keys: pki.keys,
      });
      const ids = (d: { deployments: Array<{ id: string; signalled: boolean }> }): unknown =>
        d.deployments.map((x) => [x.id, x.signalled]);
      expect(ids(v.document!)).toEqual(ids(before.md.json));
      // the sequence carries on above everything it gave out
      const again = await request(c.port, op, 'PATCH', `/v1/deployments/${dep2.json.id}`, {});
      expect(again.json.revision).toBe(3);
      const node = (await request(c.port, op, 'GET', '/v1/nodes/n1')).json;
      expect(node.generation).toBeGreaterThan(before.node.generation);
      // the signal's duplicate is still a duplicate; the old revision of dep2 is stale
      expect(
        (
          await request(c.port, n1, 'POST', `/v1/nodes/n1/deployments/${dep.json.id}/signal`, {
            revision: 1,
            deploy_status_code: 1,
            outputs: {},
          })
        ).json.status,
      ).toBe('COMPLETE');
      expect(
        (
          await request(c.port, n1, 'POST', `/v1/nodes/n1/deployments/${dep2.json.id}/signal`, {
            revision: 2,
            deploy_status_code: 0,
            outputs: {},
          })
        ).json.error.code,
      ).toBe('stale_revision');
      expect(c.log()).not.toContain('secret-value');
    } finally {
      const end2 = await c.kill('SIGTERM');
      expect(end2.code).toBe(0);
      expect(c.log()).toContain('controller stopped');
    }
  });
});

describe('start-up', () => {
  it('names the option of a start-up mistake and exits non-zero', () => {
    const run = (args: string[], env: NodeJS.ProcessEnv = {}) =>
      spawnSync(process.execPath, [HERALD, 'controller', ...args], {
        cwd: REPO,
        encoding: 'utf8',
        env: { ...process.env, ...env },
        timeout: 20_000,
      });
    let r = run(['--pki', pki.dir]);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/bad_option: --db/);
    r = run(['--pki', pki.dir, '--db', path.join(work, 'x.db'), '--listen', 'nope']);
    expect(r.stderr).toMatch(/--listen/);
    r = run(['--db', path.join(work, 'x.db')], {
      HERALD_CONTROLLER_PKI: pki.dir,
      HERALD_CONTROLLER_PUSH_WORKERS: 'many',
    });
    expect(r.stderr).toMatch(/--push-workers/);
    r = run(['--pki', path.join(work, 'no-pki'), '--db', path.join(work, 'x.db')]);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/pki_missing/);
    const cfg = path.join(work, 'cfg.json');
    fs.writeFileSync(cfg, JSON.stringify({ pki: pki.dir, db: path.join(work, 'x.db'), colour: 'red' }));
    r = run(['--config', cfg]);
    expect(r.stderr).toMatch(/unknown key "colour"/);
  });
});

/**
 * A connection without a valid certificate cannot hold a place in the pre-authentication pool
 * by sending nothing: it is closed API_UNAUTHENTICATED_HEADERS_DEADLINE_MS after its handshake
 * (`headers_timeout`, counted), while one that sends its request gets its answer. Real TLS,
 * in-process controller with the deadline shortened. (A connection trickling its headers:
 * test/integration/enroll-admission.test.ts.)
 */
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestController, waitFor, type TestController } from '../helpers/controller-harness.js';
import { makeControllerTestPki, type ControllerTestPki } from '../helpers/controller-pki.js';

let pki: ControllerTestPki;
let t: TestController;

beforeAll(async () => {
  pki = await makeControllerTestPki();
  t = await startTestController(pki, {}, { unauthenticatedHeadersDeadlineMs: 200 });
});

afterAll(async () => {
  await t?.close();
  pki?.cleanup();
});

describe('idle connections before authentication', () => {
  it('one that sends no request is closed (headers_timeout); one that does is answered 403 no_client_certificate', async () => {
    const idle = tls.connect({ host: '127.0.0.1', port: t.port, servername: 'localhost', ...pki.noCert });
    idle.on('error', () => {});
    await new Promise<void>((resolve) => idle.once('close', () => resolve()));
    await waitFor('the headers_timeout refusal in metrics', async () => {
      const m = (await t.req(pki.cred('operator', 'admin'), 'GET', '/metrics')).text;
      return Number(/herald_api_refusals_total\{code="headers_timeout"\} (\d+)/.exec(m)?.[1] ?? 0) >= 1;
    });
    const r = await t.req(pki.noCert, 'GET', '/v1/nodes');
    expect({ status: r.status, code: r.json?.error?.code }).toEqual({ status: 403, code: 'no_client_certificate' });
  });
});

/**
 * One controller's key cannot speak for another (docs/several-controllers.md): a wake-up or a metadata signature is
 * accepted only when its `kid` is a key of the controller its `iss` names; a JWKS key without a
 * `controller` member (a PKI made before per-controller keys) is the first controller's,
 * `controller`, and nobody else's. And the `--controller-id` list: names, or `*`.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { codeOf } from '../../protocol/errors.js';
import { acceptsController, parseControllerIds } from '../../protocol/identity.js';
import { checkKeyIssuer, KeySet, Signer } from '../../protocol/jws.js';
import { newNonce, sha256b64url, signMetadata, verifyMetadataResponse } from '../../protocol/metadata.js';
import { signWake, WakeVerifier } from '../../protocol/wake.js';
import { makeSigningKey, type TestSigningKey } from '../helpers/signing-keys.js';

const TD = 'herald.local';
const ctl = (n: string): string => `spiffe://${TD}/controller/${n}`;
const AGENT = `spiffe://${TD}/agent/n1`;
const NOW = 1_800_000_000;

let a: TestSigningKey;
let b: TestSigningKey;
let legacy: TestSigningKey;
let keys: KeySet;

beforeAll(async () => {
  [a, b, legacy] = await Promise.all([makeSigningKey(), makeSigningKey(), makeSigningKey()]);
  keys = new KeySet({
    keys: [
      { ...a.pub, controller: 'ca' },
      { ...b.pub, controller: 'cb' },
      legacy.pub, // no controller: the first controller's
    ],
  });
});

function code(fn: () => unknown): string {
  try {
    fn();
    return 'ok';
  } catch (e) {
    return codeOf(e) ?? `uncoded: ${String(e)}`;
  }
}

/** A wake-up signed with `key`, claiming `iss`, sent over a TLS connection from `peer` (default iss). */
function wake(key: TestSigningKey, iss: string, peer = iss): string {
  const v = new WakeVerifier({ audience: AGENT, keys: () => keys, startedAtS: NOW - 60, nowS: () => NOW });
  const token = signWake(new Signer(key.priv), { iss, aud: AGENT, gen: 1, reason: 'deployment', nowS: NOW });
  return code(() => v.verify(token, peer));
}

/** A metadata 200 signed with `key` claiming `iss`, answered by the API server `server`. */
function metadata(key: TestSigningKey, iss: string, server = iss): string {
  const nonce = newNonce();
  const body = Buffer.from(JSON.stringify({ node: 'n1', generation: 3, deployments: [] }));
  const signature = signMetadata(new Signer(key.priv), {
    iss,
    aud: AGENT,
    gen: 3,
    nonce,
    sha256: sha256b64url(body),
    nowS: NOW,
  });
  return code(() =>
    verifyMetadataResponse({ status: 200, signature, body, nonce, audience: AGENT, issuer: server, keys }),
  );
}

describe("a controller's key speaks for that controller alone", () => {
  it('wake-ups: the key of the controller iss names is accepted', () => {
    expect(wake(a, ctl('ca'))).toBe('ok');
    expect(wake(b, ctl('cb'))).toBe('ok');
  });

  it("wake-ups: controller A's kid with iss controller B is wrong_issuer, even from B's own connection", () => {
    expect(wake(a, ctl('cb'))).toBe('wrong_issuer');
    expect(wake(b, ctl('ca'))).toBe('wrong_issuer');
  });

  it('metadata: the key of the answering controller is accepted', () => {
    expect(metadata(a, ctl('ca'))).toBe('ok');
    expect(metadata(b, ctl('cb'))).toBe('ok');
  });

  it("metadata: controller A's kid with iss controller B is wrong_issuer", () => {
    expect(metadata(a, ctl('cb'))).toBe('wrong_issuer');
    expect(metadata(b, ctl('ca'))).toBe('wrong_issuer');
    // and iss must still be the server that answered
    expect(metadata(a, ctl('ca'), ctl('cb'))).toBe('wrong_issuer');
  });

  it('a key that names no controller belongs to the controller named controller only (a PKI made before several controllers)', () => {
    expect(wake(legacy, ctl('controller'))).toBe('ok');
    expect(metadata(legacy, ctl('controller'))).toBe('ok');
    expect(wake(legacy, ctl('ca'))).toBe('wrong_issuer');
    expect(metadata(legacy, ctl('cb'))).toBe('wrong_issuer');
    expect(keys.controllerOf(legacy.pub.kid)).toBe('controller');
  });

  it('an iss that is not a controller is wrong_issuer', () => {
    expect(code(() => checkKeyIssuer(keys, a.pub.kid, `spiffe://${TD}/agent/ca`))).toBe('wrong_issuer');
    expect(code(() => checkKeyIssuer(keys, a.pub.kid, 42))).toBe('wrong_issuer');
    expect(code(() => checkKeyIssuer(keys, a.pub.kid, `${ctl('ca')}/x`))).toBe('wrong_issuer');
  });

  it('a JWKS key whose controller is not a valid name is not trusted at all', () => {
    const k = new KeySet({
      keys: [
        { ...a.pub, controller: '../ca' },
        { ...b.pub, controller: 7 },
      ],
    });
    expect(k.size).toBe(0);
    expect(k.controllerOf(a.pub.kid)).toBeUndefined();
  });

  it('a revoked kid has no controller', () => {
    const k = new KeySet({ keys: [{ ...a.pub, controller: 'ca' }] }, [a.pub.kid]);
    expect(k.controllerOf(a.pub.kid)).toBeUndefined();
  });
});

describe('--controller-id: a list of names, or *', () => {
  it('parses one name, a list (spaces and repeats tolerated), and *', () => {
    expect(parseControllerIds('controller')).toEqual(['controller']);
    expect(parseControllerIds('c1,c2, c3,c1')).toEqual(['c1', 'c2', 'c3']);
    expect(parseControllerIds('*')).toBe('*');
  });

  it.each(['', 'c1,', ',c1', 'C1', 'c1,*', 'a/b', 'c1,,c2', '-x'])(
    'refuses %j with bad_option naming --controller-id',
    (v) => {
      let err: unknown;
      try {
        parseControllerIds(v);
      } catch (e) {
        err = e;
      }
      expect(codeOf(err)).toBe('bad_option');
      expect((err as { field?: string }).field).toBe('controller-id');
      expect((err as Error).message).toContain('--controller-id');
    },
  );

  it('a list accepts exactly its names; * accepts every valid controller name', () => {
    const ids = parseControllerIds('c1,c2');
    expect(acceptsController(ids, 'c1')).toBe(true);
    expect(acceptsController(ids, 'c2')).toBe(true);
    expect(acceptsController(ids, 'c3')).toBe(false);
    expect(acceptsController(ids, 'controller')).toBe(false);
    expect(acceptsController('*', 'anything-valid')).toBe(true);
    expect(acceptsController('*', 'Bad/Name')).toBe(false);
  });
});

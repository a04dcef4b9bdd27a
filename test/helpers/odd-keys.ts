/**
 * Keys and CSRs of the shapes a hostile peer may send before it is authenticated (SECURITY.md,
 * "Enrolment"): RSA keys of any modulus and exponent (written as DER by hand, since no library
 * makes them), DSA, Ed448, X25519, curves Herald does not name, explicit EC parameters, and CSRs
 * that are truncated, nested deep, of odd lengths or oversized. Each case says what it is; the
 * tests assert only that every one is refused with a code, cheaply.
 */
import crypto from 'node:crypto';
import { makeCsr } from '../../certs/csr.js';
import {
  bitString,
  csrWithSpki,
  derOf,
  NULL,
  OID_RSA,
  oddNumber,
  oid,
  pemOf,
  rsaSpki,
  seq,
  tlv,
  uint,
} from '../../bench/hostile-csr.js';

export { csrWithSpki, derOf, oddNumber, pemOf, rsaSpki } from '../../bench/hostile-csr.js';

function spkiOf(key: crypto.KeyObject): Buffer {
  return key.export({ type: 'spki', format: 'der' });
}

export interface OddCsr {
  what: string;
  csr: unknown;
  /** The code the CSR reader answers (the enrolment route folds all into enrollment_refused). */
  code: 'bad_key' | 'bad_csr';
}

/**
 * Every extreme shape, for one node name. `goodKey` (an RSA-2048 private key) makes the valid
 * CSRs that are then cut, nested or padded.
 */
export function oddCsrs(node: string, goodKey: crypto.KeyObject): OddCsr[] {
  const good = makeCsr({
    keyPem: goodKey.export({ type: 'pkcs8', format: 'pem' }) as string,
    commonName: node,
    uris: [`spiffe://herald.local/agent/${node}`],
  });
  const goodDer = derOf(good);
  const e65537 = Buffer.from([1, 0, 1]);
  const out: OddCsr[] = [
    // the review's case: a 1,024-byte modulus and a 1,024-byte exponent (4.3 s in node-forge)
    {
      what: 'RSA 8192-bit modulus, 8192-bit exponent',
      csr: csrWithSpki(rsaSpki(oddNumber(1024), oddNumber(1024, 2)), { sigBytes: 1024 }),
      code: 'bad_key',
    },
    {
      what: 'RSA 2048-bit, 2048-bit exponent',
      csr: csrWithSpki(rsaSpki(oddNumber(256), oddNumber(256, 3))),
      code: 'bad_key',
    },
    {
      what: 'RSA 16384-bit modulus',
      csr: csrWithSpki(rsaSpki(oddNumber(2048), e65537), { sigBytes: 2048 }),
      code: 'bad_key',
    },
    { what: 'RSA 1024-bit', csr: csrWithSpki(rsaSpki(oddNumber(128), e65537), { sigBytes: 128 }), code: 'bad_key' },
    { what: 'RSA e = 1', csr: csrWithSpki(rsaSpki(oddNumber(256), Buffer.from([1]))), code: 'bad_key' },
    { what: 'RSA e = 3', csr: csrWithSpki(rsaSpki(oddNumber(256), Buffer.from([3]))), code: 'bad_key' },
    { what: 'RSA e even', csr: csrWithSpki(rsaSpki(oddNumber(256), Buffer.from([1, 0, 0]))), code: 'bad_key' },
    {
      what: 'RSA even modulus',
      csr: csrWithSpki(rsaSpki(Buffer.concat([oddNumber(255), Buffer.from([2])]), e65537)),
      code: 'bad_key',
    },
    { what: 'RSA modulus 0', csr: csrWithSpki(rsaSpki(Buffer.from([0]), e65537)), code: 'bad_key' },
    {
      what: 'RSA key with parameters other than NULL',
      csr: csrWithSpki(seq(seq(oid(OID_RSA), oid('1.2.3')), bitString(seq(uint(oddNumber(256)), uint(e65537))))),
      code: 'bad_key',
    },
    {
      what: 'EC explicit curve parameters',
      csr: csrWithSpki(
        seq(
          seq(
            oid('1.2.840.10045.2.1'),
            seq(tlv(0x02, Buffer.from([1])), seq(oid('1.2.840.10045.1.1'), uint(oddNumber(32)))),
          ),
          bitString(Buffer.concat([Buffer.from([4]), oddNumber(64)])),
        ),
      ),
      code: 'bad_key',
    },
    {
      what: 'unknown algorithm OID',
      csr: csrWithSpki(seq(seq(oid('1.2.3.4.5.6.7')), bitString(oddNumber(32)))),
      code: 'bad_key',
    },
    {
      what: 'SPKI with bytes after the key',
      csr: csrWithSpki(seq(seq(oid(OID_RSA), NULL), bitString(seq(uint(oddNumber(256)), uint(e65537))), NULL)),
      code: 'bad_key',
    },
  ];
  for (const [what, gen] of [
    ['DSA 2048', () => crypto.generateKeyPairSync('dsa', { modulusLength: 2048, divisorLength: 256 })],
    ['Ed448', () => crypto.generateKeyPairSync('ed448')],
    ['Ed25519 (not certified by the issuer)', () => crypto.generateKeyPairSync('ed25519')],
    ['X25519', () => crypto.generateKeyPairSync('x25519')],
    ['EC P-521', () => crypto.generateKeyPairSync('ec', { namedCurve: 'secp521r1' })],
    ['EC secp256k1', () => crypto.generateKeyPairSync('ec', { namedCurve: 'secp256k1' })],
    ['EC P-256 (not certified by the issuer)', () => crypto.generateKeyPairSync('ec', { namedCurve: 'prime256v1' })],
    ['RSASSA-PSS 2048', () => crypto.generateKeyPairSync('rsa-pss', { modulusLength: 2048 })],
  ] as const) {
    out.push({ what, csr: csrWithSpki(spkiOf(gen().publicKey)), code: 'bad_key' });
  }
  // a real RSA-1024 key, really signed: the policy, not the signature, refuses it
  const small = crypto.generateKeyPairSync('rsa', { modulusLength: 1024 });
  out.push({
    what: 'RSA-1024, validly signed',
    csr: csrWithSpki(spkiOf(small.publicKey), { signWith: small.privateKey }),
    code: 'bad_key',
  });
  const big = crypto.generateKeyPairSync('rsa', { modulusLength: 2048, publicExponent: 3 });
  out.push({
    what: 'RSA-2048 e = 3, validly signed',
    csr: csrWithSpki(spkiOf(big.publicKey), { signWith: big.privateKey }),
    code: 'bad_key',
  });
  // shapes of the request itself
  out.push(
    { what: 'truncated DER', csr: pemOf(goodDer.subarray(0, goodDer.length - 40)), code: 'bad_csr' },
    { what: 'truncated to the key', csr: pemOf(goodDer.subarray(0, 60)), code: 'bad_csr' },
    { what: 'one byte', csr: pemOf(Buffer.from([0x30])), code: 'bad_csr' },
    {
      what: 'empty PEM body',
      csr: '-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n',
      code: 'bad_csr',
    },
    { what: 'deep ASN.1 nesting', csr: pemOf(deepNest(1_200)), code: 'bad_csr' },
    {
      what: 'indefinite length',
      csr: pemOf(Buffer.concat([Buffer.from([0x30, 0x80]), goodDer.subarray(4), Buffer.from([0, 0])])),
      code: 'bad_csr',
    },
    {
      what: 'length past the end',
      csr: pemOf(Buffer.concat([Buffer.from([0x30, 0x84, 0x7f, 0xff, 0xff, 0xff]), goodDer.subarray(4)])),
      code: 'bad_csr',
    },
    { what: 'bytes after the request', csr: pemOf(Buffer.concat([goodDer, Buffer.from([0, 0])])), code: 'bad_csr' },
    {
      what: 'signed with an unread algorithm',
      csr: csrWithSpki(spkiOf(crypto.createPublicKey(goodKey)), { signWith: goodKey, sigOid: '1.2.840.113549.1.1.5' }),
      code: 'bad_csr',
    },
    {
      what: 'a signature that does not verify',
      csr: csrWithSpki(spkiOf(crypto.createPublicKey(goodKey))),
      code: 'bad_csr',
    },
    { what: 'oversized PEM', csr: pemOf(Buffer.concat([goodDer, Buffer.alloc(9_000)])), code: 'bad_csr' },
    { what: 'a certificate, not a request', csr: good.replace(/CERTIFICATE REQUEST/g, 'CERTIFICATE'), code: 'bad_csr' },
    { what: 'not a string', csr: { n: 1 }, code: 'bad_csr' },
  );
  return out;
}

/** A SEQUENCE nested `depth` deep (a parser that recurses on it may overflow its stack). */
function deepNest(depth: number): Buffer {
  let b: Buffer = Buffer.alloc(0);
  for (let i = 0; i < depth; i++) b = seq(b);
  return b;
}

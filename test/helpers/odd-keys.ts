/**
 * Keys and CSRs of the shapes a hostile peer may send before it is authenticated (SECURITY.md,
 * "Enrolment"): RSA keys of any modulus and exponent (written as DER by hand, since no library
 * makes them), DSA, Ed448, X25519, curves Herald does not name, explicit EC parameters, and CSRs
 * that are truncated, nested deep, of odd lengths or oversized. Each case says what it is; the
 * tests assert only that every one is refused with a code, cheaply.
 */
import crypto from 'node:crypto';
import { makeCsr } from '../../certs/csr.js';

function len(n: number): Buffer {
  if (n < 0x80) return Buffer.from([n]);
  const bytes: number[] = [];
  for (let v = n; v > 0; v = Math.floor(v / 256)) bytes.unshift(v & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}

export function tlv(tag: number, ...content: Buffer[]): Buffer {
  const body = Buffer.concat(content);
  return Buffer.concat([Buffer.from([tag]), len(body.length), body]);
}

export function oid(dotted: string): Buffer {
  const parts = dotted.split('.').map(Number);
  const out: number[] = [40 * parts[0]! + parts[1]!];
  for (const p of parts.slice(2)) {
    const chunk: number[] = [p & 0x7f];
    for (let v = p >>> 7; v > 0; v >>>= 7) chunk.unshift((v & 0x7f) | 0x80);
    out.push(...chunk);
  }
  return tlv(0x06, Buffer.from(out));
}

const seq = (...c: Buffer[]): Buffer => tlv(0x30, ...c);
const set = (...c: Buffer[]): Buffer => tlv(0x31, ...c);
/** A positive INTEGER of these magnitude bytes. */
const uint = (b: Buffer): Buffer => tlv(0x02, b[0]! & 0x80 ? Buffer.concat([Buffer.from([0]), b]) : b);
const bitString = (b: Buffer): Buffer => tlv(0x03, Buffer.from([0]), b);
const NULL = Buffer.from([0x05, 0x00]);
const OID_RSA = '1.2.840.113549.1.1.1';
const OID_SHA256_RSA = '1.2.840.113549.1.1.11';

/** An odd random number of `bytes` bytes, top bit set (a plausible modulus or exponent). */
export function oddNumber(bytes: number, seed = 1): Buffer {
  const b = crypto.createHash('sha512').update(`odd-${bytes}-${seed}`).digest();
  const out = Buffer.alloc(bytes);
  for (let i = 0; i < bytes; i++) out[i] = b[i % b.length]! ^ (i & 0xff);
  out[0]! |= 0x80;
  out[bytes - 1]! |= 1;
  return out;
}

/** An RSA SubjectPublicKeyInfo with this modulus and exponent, whatever they are. */
export function rsaSpki(n: Buffer, e: Buffer): Buffer {
  return seq(seq(oid(OID_RSA), NULL), bitString(seq(uint(n), uint(e))));
}

/**
 * A CSR carrying `spki`, signed (SHA-256 with RSA) with `signWith` when given, else with a
 * signature of `sigBytes` random-looking bytes (the size of the key's modulus, as a real one).
 */
export function csrWithSpki(
  spki: Buffer,
  o: { signWith?: crypto.KeyObject; sigBytes?: number; sigOid?: string; node?: string } = {},
): string {
  const node = o.node ?? 'odd1';
  const info = seq(
    tlv(0x02, Buffer.from([0])),
    seq(set(seq(oid('2.5.4.3'), tlv(0x0c, Buffer.from(node))))),
    spki,
    tlv(0xa0),
  );
  const sig = o.signWith ? crypto.sign('sha256', info, o.signWith) : oddNumber(o.sigBytes ?? 256, 7);
  return pemOf(seq(info, seq(oid(o.sigOid ?? OID_SHA256_RSA), NULL), bitString(sig)));
}

export function pemOf(der: Buffer): string {
  const b64 = der.toString('base64').replace(/(.{64})/g, '$1\n');
  return `-----BEGIN CERTIFICATE REQUEST-----\n${b64.trimEnd()}\n-----END CERTIFICATE REQUEST-----\n`;
}

export function derOf(pem: string): Buffer {
  return Buffer.from(pem.replace(/-----[^-]+-----|\s/g, ''), 'base64');
}

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

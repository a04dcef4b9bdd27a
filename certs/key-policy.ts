/**
 * Which public keys Herald accepts from a peer, checked before any signature work (SECURITY.md,
 * "Enrolment"). The cost of verifying a signature is the key's: an RSA modulus or exponent a
 * peer may choose at will makes one unauthenticated request cost seconds of CPU. So a key is
 * admitted only by name, from its SubjectPublicKeyInfo's algorithm identifier (read with the
 * strict reader in der.ts, before OpenSSL decodes anything), and then by its decoded details:
 *
 * - `rsa`: rsaEncryption, MIN_PEER_RSA_KEY_BITS to MAX_PEER_RSA_KEY_BITS, exponent 65537;
 * - `ec`: id-ecPublicKey on the named curve P-256 or P-384 (never explicit curve parameters);
 * - `ed25519`.
 *
 * Everything else (DSA, RSASSA-PSS keys, Ed448, X25519, other curves, explicit parameters,
 * trailing bytes) is refused `bad_key`. An entry point names the families it can use: a CSR's
 * key must be RSA, the one kind the issuer's encoder (node-forge) certifies.
 */
import crypto from 'node:crypto';
import { HeraldError } from '../protocol/errors.js';
import { MAX_PEER_RSA_KEY_BITS, MIN_PEER_RSA_KEY_BITS } from '../protocol/limits.js';
import { childrenOf, DerError, oidOf, readWhole, TAG } from './der.js';

export type KeyFamily = 'rsa' | 'ec' | 'ed25519';

/** Every family a peer's key may be of. */
export const PEER_KEY_FAMILIES: readonly KeyFamily[] = ['rsa', 'ec', 'ed25519'];

const RSA_EXPONENT = 65537n;
const OID_RSA = '1.2.840.113549.1.1.1';
const OID_EC = '1.2.840.10045.2.1';
const OID_ED25519 = '1.3.101.112';
/** Named curves admitted, by OID, with Node's name for them. */
const CURVES: Record<string, string> = {
  '1.2.840.10045.3.1.7': 'prime256v1',
  '1.3.132.0.34': 'secp384r1',
};
/** Names for the refusal message of keys often met; others are named by their OID. */
const KNOWN: Record<string, string> = {
  '1.2.840.10040.4.1': 'DSA',
  '1.2.840.113549.1.1.10': 'RSASSA-PSS',
  '1.3.101.113': 'Ed448',
  '1.3.101.110': 'X25519',
  '1.3.101.111': 'X448',
  '1.2.840.10046.2.1': 'DH',
};

/** A key admitted by the policy. */
export interface AdmittedKey {
  family: KeyFamily;
  key: crypto.KeyObject;
}

function refuse(message: string, cause?: unknown): never {
  throw new HeraldError('bad_key', message, cause === undefined ? undefined : { cause });
}

/**
 * Admits a SubjectPublicKeyInfo (DER) a peer sent, or refuses it.
 * @param families the families this entry point accepts (default: every one of PEER_KEY_FAMILIES)
 * @throws HeraldError `bad_key`
 */
export function admitSpki(spki: Buffer, families: readonly KeyFamily[] = PEER_KEY_FAMILIES): AdmittedKey {
  let family: KeyFamily;
  try {
    const outer = readWhole(spki, TAG.sequence, 'SubjectPublicKeyInfo');
    const [alg, bits, ...rest] = childrenOf(spki, outer);
    if (alg?.tag !== TAG.sequence || bits?.tag !== TAG.bitString || rest.length > 0)
      refuse('the key is not a SubjectPublicKeyInfo');
    const [oidTlv, params, ...more] = childrenOf(spki, alg);
    if (oidTlv === undefined || more.length > 0) refuse("the key's algorithm identifier is malformed");
    const oid = oidOf(spki, oidTlv);
    if (oid === OID_RSA) {
      // rsaEncryption's parameters are NULL (RFC 3279)
      if (params?.tag !== TAG.null || params.end !== params.body) refuse('an RSA key with parameters other than NULL');
      family = 'rsa';
    } else if (oid === OID_EC) {
      const curve = params?.tag === TAG.oid ? oidOf(spki, params) : undefined;
      if (curve === undefined) refuse('an EC key without a named curve (explicit curve parameters are not read)');
      if (!(curve in CURVES)) refuse(`an EC key on curve ${curve}: only P-256 and P-384`);
      family = 'ec';
    } else if (oid === OID_ED25519) {
      if (params !== undefined) refuse('an Ed25519 key with parameters');
      family = 'ed25519';
    } else {
      return refuse(`a ${KNOWN[oid] ?? `key of algorithm ${oid}`}: only RSA, ECDSA P-256/P-384 and Ed25519`);
    }
  } catch (err) {
    if (err instanceof DerError) refuse(`the key does not parse (${err.message})`, err);
    throw err;
  }
  if (!families.includes(family)) refuse(`an ${family} key where only ${families.join(', ')} is accepted`);
  let key: crypto.KeyObject;
  try {
    key = crypto.createPublicKey({ key: spki, format: 'der', type: 'spki' });
  } catch (err) {
    return refuse('the key does not decode', err);
  }
  return admitKey(key, families);
}

/**
 * Admits a decoded public key (one OpenSSL already read, a certificate's), or refuses it.
 * @throws HeraldError `bad_key`
 */
export function admitKey(key: crypto.KeyObject, families: readonly KeyFamily[] = PEER_KEY_FAMILIES): AdmittedKey {
  const type = key.asymmetricKeyType;
  const d = key.asymmetricKeyDetails ?? {};
  let family: KeyFamily | undefined;
  if (type === 'rsa') {
    const bits = d.modulusLength ?? 0;
    if (bits < MIN_PEER_RSA_KEY_BITS || bits > MAX_PEER_RSA_KEY_BITS)
      refuse(`an RSA key of ${bits} bits: only ${MIN_PEER_RSA_KEY_BITS} to ${MAX_PEER_RSA_KEY_BITS}`);
    if (d.publicExponent !== RSA_EXPONENT)
      refuse(`an RSA key with exponent ${String(d.publicExponent).slice(0, 40)}: only 65537`);
    // an even modulus is no RSA key (and not what OpenSSL's fast path expects)
    const n = Buffer.from(key.export({ format: 'jwk' }).n ?? '', 'base64url');
    if (((n[n.length - 1] ?? 0) & 1) === 0) refuse('an RSA key whose modulus is even');
    family = 'rsa';
  } else if (type === 'ec') {
    if (!Object.values(CURVES).includes(d.namedCurve ?? ''))
      refuse(`an EC key on ${d.namedCurve}: only P-256 and P-384`);
    family = 'ec';
  } else if (type === 'ed25519') family = 'ed25519';
  if (family === undefined) return refuse(`a ${type ?? 'secret'} key: only RSA, ECDSA P-256/P-384 and Ed25519`);
  if (!families.includes(family)) refuse(`an ${family} key where only ${families.join(', ')} is accepted`);
  return { family, key };
}

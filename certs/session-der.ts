/**
 * A TLS client session without the server's certificate. OpenSSL serializes a session
 * (`i2d_SSL_SESSION`, what Node's 'session' event gives) as a DER SEQUENCE whose optional
 * element `[3] EXPLICIT Certificate` is the peer's certificate. Offering the session
 * (`tls.connect({ session })`, `setSession`) decodes it again, and OpenSSL 3.0 decodes a
 * certificate's public key through its provider lookup: ~0.4 ms a session here, against ~5 µs
 * without it (2026-12-04), paid by the push worker on every redial of a reconnect storm.
 *
 * The certificate is dead weight to a client: Node shows no server certificate on a resumed
 * client socket and skips `checkServerIdentity` for it, so Herald keeps, with each session, the
 * identity, serials and notAfter its full handshake checked (certs/session-store.ts) and never
 * reads the certificate back. A TLS 1.3 session resumes without it, and Node counts the resumed
 * socket authorized as before (`VerifyPeerCertificate` answers OK for a reused TLS 1.3 session
 * with no peer certificate). A server needs the client's certificate in its tickets; this is
 * for the client's copy only.
 */

const SEQUENCE = 0x30;
/** Context-specific, constructed, tag 3: `peer` in OpenSSL's SSL_SESSION_ASN1. */
const PEER_CERTIFICATE = 0xa3;
/** `ssl_version`, the session's second element, of a TLS 1.3 session: INTEGER 0x0304. */
const TLS13_VERSION = Buffer.from([0x02, 0x02, 0x03, 0x04]);

/**
 * `session` with its peer certificate element removed; the same bytes when it has none, when it
 * is not a TLS 1.3 session (its second element, `ssl_version`, is not 0x0304: Node counts a
 * resumed TLS 1.2 session without a peer certificate unauthorized), or when the bytes are not one
 * SEQUENCE of elements with low tag numbers whose lengths add up (nothing is guessed).
 */
export function withoutPeerCertificate(session: Buffer): Buffer {
  if (session[0] !== SEQUENCE) return session;
  const outer = lengthAt(session, 1);
  if (outer === undefined || outer.end !== session.length) return session;
  const kept: Buffer[] = [];
  let found = false;
  let index = 0;
  for (let at = outer.start; at < session.length; index++) {
    const tag = session[at]!;
    // a high tag number (low five bits all set) spans more bytes: not in an SSL_SESSION
    if ((tag & 0x1f) === 0x1f) return session;
    const el = lengthAt(session, at + 1);
    if (el === undefined || el.end > session.length) return session;
    if (index === 1 && !session.subarray(at, el.end).equals(TLS13_VERSION)) return session;
    if (tag === PEER_CERTIFICATE) found = true;
    else kept.push(session.subarray(at, el.end));
    at = el.end;
  }
  if (!found) return session;
  const body = Buffer.concat(kept);
  return Buffer.concat([Buffer.from([SEQUENCE]), encodeLength(body.length), body]);
}

/** The DER length at `at`: where its contents start and end; undefined when malformed. */
function lengthAt(b: Buffer, at: number): { start: number; end: number } | undefined {
  const first = b[at];
  if (first === undefined) return undefined;
  if (first < 0x80) return { start: at + 1, end: at + 1 + first };
  const n = first & 0x7f;
  // indefinite (0x80) is not DER; more than 4 length bytes is not a session
  if (n === 0 || n > 4 || at + 1 + n > b.length) return undefined;
  let len = 0;
  for (let i = 1; i <= n; i++) len = len * 256 + b[at + i]!;
  return { start: at + 1 + n, end: at + 1 + n + len };
}

function encodeLength(len: number): Buffer {
  if (len < 0x80) return Buffer.from([len]);
  const bytes: number[] = [];
  for (let l = len; l > 0; l = Math.floor(l / 256)) bytes.unshift(l & 0xff);
  return Buffer.from([0x80 | bytes.length, ...bytes]);
}

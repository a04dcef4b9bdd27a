/**
 * A recording object store: the Swift subset unmodified OpenStack Heat uses (docs/heat-object-store.md),
 * in memory over HTTPS, recording every request. A TEST DOUBLE for the real-Heat suites
 * (test/integration/heat-fixture.test.ts, test/integration/heat-occ-node.test.ts): it proves the
 * fixtures and measures what Heat and the stock node tools send, it does not stand in for
 * Herald's own object store. TempURL signatures are recorded (which HMAC matched), not enforced.
 *
 *   const store = await startRecordingObjectStore({ cert, key });   // store.url ends in ACCOUNT
 *   store.object('herald-node1', 'metadata.json')?.body;             // what was last PUT there
 *   await store.close();
 */
import crypto from 'node:crypto';
import https from 'node:https';

/** The account every request goes to: Heat's project is `admin` in the fixture's token. */
export const ACCOUNT = '/v1/AUTH_admin';

export type Auth = 'token' | 'temp_url_sig' | 'none';

export interface Recorded {
  /** ms since the recorder started */
  at: number;
  method: string;
  path: string;
  /** query keys, sorted (values of temp_url_* are in sig/expires) */
  query: string[];
  auth: Auth;
  /** for a TempURL: which HMAC over "METHOD\nEXPIRES\nPATH" with the account key matched */
  sigAlg?: string;
  expires?: string;
  /** the request headers that matter to a Swift (content-type, x-*-meta-*, x-versions-location, ...) */
  headers: Record<string, string>;
  status: number;
  body?: string;
}

export interface StoredObject {
  body: Buffer;
  contentType: string;
  /** ms since the epoch */
  modified: number;
  etag: string;
}

export interface RecordingObjectStore {
  url: string;
  requests: Recorded[];
  object(container: string, name: string): StoredObject | undefined;
  close(): Promise<void>;
}

const HEADERS_KEPT =
  /^(content-type|content-length|transfer-encoding|x-auth-token|x-versions-location|x-(account|container|object)-meta-|x-detect-content-type|if-|range|user-agent)/;

/** Swift's Last-Modified: the timestamp rounded UP to the second (Heat compares it with a sub-second updated_at). */
const lastModified = (ms: number): string => new Date(Math.ceil(ms / 1000) * 1000).toUTCString();

function tempUrlAlg(key: string | undefined, method: string, expires: string, p: string, sig: string): string {
  if (!key) return 'no-key';
  // Swift lets a GET signature authorise HEAD
  const methods = method === 'HEAD' ? ['HEAD', 'GET', 'PUT'] : [method];
  for (const alg of ['sha256', 'sha1', 'sha512'])
    for (const m of methods)
      if (crypto.createHmac(alg, key).update(`${m}\n${expires}\n${p}`).digest('hex') === sig)
        return m === method ? `hmac-${alg}` : `hmac-${alg} (${m})`;
  return 'mismatch';
}

/**
 * The Swift subset Heat uses, in memory, recording every request: account HEAD/GET/POST (the
 * temp-url key), container PUT/HEAD/GET/DELETE, object PUT/GET/HEAD/DELETE with a token, and
 * object PUT/GET/HEAD through a TempURL whose signature it records but does not enforce.
 */
export function startRecordingObjectStore(tls: { cert: Buffer; key: Buffer }): Promise<RecordingObjectStore> {
  const t0 = Date.now();
  const requests: Recorded[] = [];
  const accountMeta = new Map<string, string>();
  const containers = new Map<string, { meta: Map<string, string>; objects: Map<string, StoredObject> }>();

  const server = https.createServer({ ...tls, requestCert: false }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const u = new URL(req.url ?? '/', 'https://x');
      const p = decodeURIComponent(u.pathname);
      const method = req.method ?? 'GET';
      const headers: Record<string, string> = {};
      for (const [k, v] of Object.entries(req.headers))
        if (HEADERS_KEPT.test(k)) headers[k] = k === 'x-auth-token' ? '(set)' : String(v);
      const sig = u.searchParams.get('temp_url_sig');
      const expires = u.searchParams.get('temp_url_expires') ?? '';
      const auth: Auth = sig ? 'temp_url_sig' : req.headers['x-auth-token'] ? 'token' : 'none';
      const rec: Recorded = {
        at: Date.now() - t0,
        method,
        path: p,
        query: [...u.searchParams.keys()].sort(),
        auth,
        headers,
        status: 0,
      };
      if (sig) {
        rec.sigAlg = tempUrlAlg(accountMeta.get('temp-url-key'), method, expires, p, sig);
        rec.expires = expires;
      }
      if (method === 'PUT' || method === 'POST') rec.body = body.toString('utf8');
      requests.push(rec);
      const send = (status: number, h: Record<string, string | number> = {}, out?: Buffer | string) => {
        rec.status = status;
        const b = out === undefined ? undefined : Buffer.from(out);
        res.writeHead(status, {
          'x-trans-id': `tx${requests.length}`,
          'content-length': method === 'HEAD' ? (h['content-length'] ?? 0) : (b?.length ?? 0),
          ...h,
        });
        res.end(method === 'HEAD' ? undefined : b);
      };

      if (!p.startsWith(ACCOUNT) || (p.length > ACCOUNT.length && p[ACCOUNT.length] !== '/')) return send(404);
      if (auth === 'none') return send(401);
      const rest = p.slice(ACCOUNT.length + 1);
      const slash = rest.indexOf('/');
      const cname = slash < 0 ? rest : rest.slice(0, slash);
      const oname = slash < 0 ? '' : rest.slice(slash + 1);
      if (auth === 'temp_url_sig' && (!oname || !['GET', 'HEAD', 'PUT'].includes(method))) return send(401);

      if (!cname) {
        // the account
        const meta = (): Record<string, string> => {
          const h: Record<string, string> = {
            'x-account-container-count': String(containers.size),
            'x-timestamp': (t0 / 1000).toFixed(5),
          };
          for (const [k, v] of accountMeta) h[`x-account-meta-${k}`] = v;
          return h;
        };
        if (method === 'HEAD') return send(204, meta());
        if (method === 'GET')
          return send(
            200,
            { ...meta(), 'content-type': 'application/json; charset=utf-8' },
            JSON.stringify([...containers.keys()].sort().map((name) => ({ name, count: 0, bytes: 0 }))),
          );
        if (method === 'POST') {
          for (const [k, v] of Object.entries(req.headers)) {
            const m = /^x-account-meta-(.+)$/.exec(k);
            if (m?.[1]) {
              if (v) accountMeta.set(m[1], String(v));
              else accountMeta.delete(m[1]);
            }
          }
          return send(204);
        }
        return send(405);
      }

      const container = containers.get(cname);
      if (!oname) {
        if (method === 'PUT') {
          const meta = container?.meta ?? new Map<string, string>();
          for (const [k, v] of Object.entries(req.headers))
            if (/^x-container-meta-|^x-versions-location$/.test(k)) meta.set(k, String(v));
          if (!container) containers.set(cname, { meta, objects: new Map() });
          return send(container ? 202 : 201);
        }
        if (!container) return send(404);
        const count = container.objects.size;
        const bytes = [...container.objects.values()].reduce((n, o) => n + o.body.length, 0);
        const h = {
          'x-container-object-count': String(count),
          'x-container-bytes-used': String(bytes),
          ...Object.fromEntries(container.meta),
        };
        if (method === 'HEAD') return send(204, h);
        if (method === 'GET') {
          const marker = u.searchParams.get('marker') ?? '';
          const listing = [...container.objects.entries()]
            .filter(([n]) => n > marker)
            .sort(([a], [b]) => (a < b ? -1 : 1))
            .map(([name, o]) => ({
              name,
              bytes: o.body.length,
              hash: o.etag,
              content_type: o.contentType,
              last_modified: new Date(o.modified).toISOString().replace('Z', ''),
            }));
          return send(200, { ...h, 'content-type': 'application/json; charset=utf-8' }, JSON.stringify(listing));
        }
        if (method === 'DELETE') {
          if (count > 0) return send(409);
          containers.delete(cname);
          return send(204);
        }
        return send(405);
      }

      if (!container) return send(404);
      const obj = container.objects.get(oname);
      if (method === 'PUT') {
        const modified = Date.now();
        const etag = crypto.createHash('md5').update(body).digest('hex');
        const ct =
          req.headers['content-type'] ?? (oname.endsWith('.json') ? 'application/json' : 'application/octet-stream');
        container.objects.set(oname, { body, contentType: ct, modified, etag });
        return send(201, { etag, 'last-modified': lastModified(modified) });
      }
      if (!obj) return send(404);
      if (method === 'GET' || method === 'HEAD')
        return send(
          200,
          {
            'content-type': obj.contentType,
            'content-length': obj.body.length,
            etag: obj.etag,
            'last-modified': lastModified(obj.modified),
            'x-timestamp': (obj.modified / 1000).toFixed(5),
            'accept-ranges': 'bytes',
          },
          obj.body,
        );
      if (method === 'DELETE') {
        container.objects.delete(oname);
        return send(204);
      }
      return send(405);
    });
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      resolve({
        url: `https://127.0.0.1:${port}${ACCOUNT}`,
        requests,
        object: (c, n) => containers.get(c)?.objects.get(n),
        close: () =>
          new Promise((r) => {
            server.closeAllConnections();
            server.close(() => r());
          }),
      });
    });
  });
}

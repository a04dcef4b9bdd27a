/**
 * A TEST DOUBLE of Keystone v3's token API, as a real HTTPS server on 127.0.0.1 port 0, for the
 * object store's token validation (controller/heat/tokens.ts). It answers only:
 *
 * - `POST /v3/auth/tokens` (password method, scoped to a project): 201, the token in
 *   `X-Subject-Token`, its `expires_at` in the body; 401 for other credentials;
 * - `GET /v3/auth/tokens` with `X-Auth-Token` (a live token it issued) and `X-Subject-Token`:
 *   200 and the token's body, 404 for a subject it does not know or that expired, 401 when the
 *   caller's own token is not live.
 *
 * Its clock is the test's (`now`), so tokens expire when the test says. It counts what it was
 * asked, and can be told to fail (`failWith`) or to hold its answers (`hang`).
 *
 *   const ks = await startKeystoneFake({ tls: pki.cred('controller', 'controller'), now: () => clock });
 *   ks.addToken('tok-a', { project: 'p1', roles: ['swiftoperator'] });
 *   ks.requests.get  // validations asked
 */
import type http from 'node:http';
import https from 'node:https';

export interface FakeToken {
  project?: string;
  user?: string;
  roles?: string[];
  /** ms since the epoch, by the fake's clock; default an hour after it was added. */
  expiresAtMs?: number;
}

export interface KeystoneFakeOptions {
  tls: { cert: Buffer; key: Buffer };
  /** The clock tokens expire by (ms). */
  now: () => number;
  /** The service user's credentials the fake accepts. */
  service?: { user: string; domain: string; password: string; project: string; projectDomain: string };
  /** Lifetime of the service tokens it issues. Default an hour. */
  serviceTokenLifetimeMs?: number;
}

export interface KeystoneFake {
  /** `https://127.0.0.1:<port>/v3` */
  readonly url: string;
  /** What it was asked: token issues (POST), validations (GET), and GETs refused 401. */
  readonly requests: { post: number; get: number; refused401: number };
  /** The query string of the last request (`?nocatalog`). */
  readonly lastQuery: string;
  addToken(token: string, t: FakeToken): void;
  /** Every service token issued so far stops being accepted (as if revoked or expired in Keystone). */
  revokeServiceTokens(): void;
  /** Answers every request with this status and an empty body until called with undefined. */
  failWith(status: number | undefined): void;
  /** Holds requests unanswered while on; called with false, answers those held as if they had just come. */
  hang(on: boolean): void;
  /** Requests held unanswered now. */
  readonly held: number;
  close(): Promise<void>;
}

export const FAKE_SERVICE = {
  user: 'herald',
  domain: 'Default',
  password: 'herald-service-password',
  project: 'service',
  projectDomain: 'Default',
} as const;

interface AuthBody {
  auth?: {
    identity?: {
      methods?: string[];
      password?: { user?: { name?: string; domain?: { name?: string; id?: string }; password?: string } };
    };
    scope?: { project?: { name?: string; domain?: { name?: string; id?: string } } };
  };
}

export function startKeystoneFake(o: KeystoneFakeOptions): Promise<KeystoneFake> {
  const service = o.service ?? FAKE_SERVICE;
  const serviceLifeMs = o.serviceTokenLifetimeMs ?? 3_600_000;
  const users = new Map<string, Required<FakeToken>>();
  const services = new Map<string, number>();
  const requests = { post: 0, get: 0, refused401: 0 };
  let issued = 0;
  let lastQuery = '';
  let failing: number | undefined;
  let hanging = false;
  const held: Array<() => void> = [];

  const body = (t: Required<FakeToken>): string =>
    JSON.stringify({
      token: {
        methods: ['password'],
        expires_at: new Date(t.expiresAtMs).toISOString().replace('Z', '000Z'),
        issued_at: new Date(o.now()).toISOString(),
        user: { id: t.user, name: `${t.user}-name`, domain: { id: 'default', name: 'Default' } },
        ...(t.project ? { project: { id: t.project, name: `${t.project}-name`, domain: { id: 'default' } } } : {}),
        roles: t.roles.map((name) => ({ id: `${name}-id`, name })),
        audit_ids: ['fake'],
      },
    });

  const server = https.createServer({ cert: o.tls.cert, key: o.tls.key }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => {
      if (req.method === 'POST') requests.post++;
      if (req.method === 'GET') requests.get++;
      if (hanging) held.push(() => answer(req, res, chunks));
      else answer(req, res, chunks);
    });
  });

  const answer = (req: http.IncomingMessage, res: http.ServerResponse, chunks: Buffer[]) => {
    const u = new URL(req.url ?? '/', 'https://x');
    lastQuery = u.search;
    const send = (status: number, text = '', headers: Record<string, string> = {}): void => {
      res.writeHead(status, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(text),
        ...headers,
      });
      res.end(text);
    };
    if (failing !== undefined) return send(failing);
    if (u.pathname !== '/v3/auth/tokens') return send(404);

    if (req.method === 'POST') {
      let b: AuthBody;
      try {
        b = JSON.parse(Buffer.concat(chunks).toString('utf8')) as AuthBody;
      } catch {
        return send(400);
      }
      const id = b.auth?.identity;
      const user = id?.password?.user;
      const scope = b.auth?.scope?.project;
      // a domain by name, or Keystone's own `default` by id
      const inDomain = (d: { name?: string; id?: string } | undefined, name: string): boolean =>
        d?.name === name || (name === 'Default' && d?.id === 'default');
      const ok =
        id?.methods?.[0] === 'password' &&
        user?.name === service.user &&
        inDomain(user.domain, service.domain) &&
        user.password === service.password &&
        scope?.name === service.project &&
        inDomain(scope.domain, service.projectDomain);
      if (!ok) return send(401, '{"error":{"code":401}}');
      const token = `svc-${++issued}`;
      const expiresAtMs = o.now() + serviceLifeMs;
      services.set(token, expiresAtMs);
      return send(201, body({ project: 'service-id', user: 'herald-id', roles: ['service'], expiresAtMs }), {
        'x-subject-token': token,
      });
    }
    if (req.method === 'GET') {
      const caller = String(req.headers['x-auth-token'] ?? '');
      const until = services.get(caller);
      if (until === undefined || until <= o.now()) {
        requests.refused401++;
        return send(401, '{"error":{"code":401}}');
      }
      const t = users.get(String(req.headers['x-subject-token'] ?? ''));
      if (!t || t.expiresAtMs <= o.now()) return send(404, '{"error":{"code":404}}');
      return send(200, body(t));
    }
    send(405);
  };

  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      resolve({
        url: `https://127.0.0.1:${port}/v3`,
        requests,
        get lastQuery() {
          return lastQuery;
        },
        addToken(token, t) {
          users.set(token, {
            project: t.project ?? '',
            user: t.user ?? 'u1',
            roles: t.roles ?? [],
            expiresAtMs: t.expiresAtMs ?? o.now() + 3_600_000,
          });
        },
        revokeServiceTokens: () => services.clear(),
        failWith: (status) => {
          failing = status;
        },
        hang: (on) => {
          hanging = on;
          if (!on) for (const f of held.splice(0)) f();
        },
        get held() {
          return held.length;
        },
        close: () =>
          new Promise<void>((r) => {
            server.closeAllConnections();
            server.close(() => r());
          }),
      });
    });
  });
}

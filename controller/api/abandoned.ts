/**
 * Whether a request is run at all: one whose connection is gone by the time its handler would run
 * is not, since its answer could not be sent and its effect (a spent join token, a new deployment)
 * would be unknown to the client that asked. (A client gone later is what enrolment's replay is
 * for: controller/service/enroll-replay.ts.) The API server (controller/api/server.ts) asks this
 * just before it runs a handler, after the body has been read.
 */
import type http from 'node:http';
import type { Logger } from 'pino';

/** True (and logged, `request.abandoned` with code `client_gone`) when the request must not run. */
export function abandoned(req: http.IncomingMessage, route: string, log: Pick<Logger, 'debug'>): boolean {
  if (!req.socket.destroyed) return false;
  log.debug(
    { event: 'request.abandoned', code: 'client_gone', route, method: req.method, remote: req.socket.remoteAddress },
    'the client left before its request ran',
  );
  return true;
}

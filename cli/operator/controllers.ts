/**
 * `herald controllers` for people: the table of `GET /v1/controllers` (docs/several-controllers.md), one row per
 * controller of the database, and the help that says what each column means. Pure: strings only,
 * so the demo prints the same table.
 */
import type { ControllerView } from '../../protocol/rest.js';
import { formatMs, table } from './format.js';

/** The columns, in order. */
export const CONTROLLERS_HEADERS = ['NAME', 'LIVE', 'OWNED', 'HELD', 'HEARTBEAT', 'API URL'];

/**
 * How long ago `heartbeatAt` was at `nowMs` (epoch ms): `1.20 s ago`; a heartbeat a little
 * ahead of our clock (the database's clock is another machine's) shows as `now`.
 */
export function heartbeatAge(heartbeatAt: string, nowMs: number): string {
  const t = Date.parse(heartbeatAt);
  if (!Number.isFinite(t)) return '-';
  const age = nowMs - t;
  return age <= 0 ? 'now' : `${formatMs(age)} ago`;
}

/** The table `herald controllers` prints, with a closing line of totals. */
export function controllersTable(items: ControllerView[], nowMs: number): string {
  const rows = items.map((c) => [
    c.name,
    c.live ? 'yes' : 'no',
    c.nodes_owned,
    // what a dead controller last reported holding is no longer true
    c.live ? c.nodes_held : '-',
    heartbeatAge(c.heartbeat_at, nowMs),
    c.api_url,
  ]);
  const live = items.filter((c) => c.live).length;
  const owned = items.reduce((a, c) => a + c.nodes_owned, 0);
  const held = items.reduce((a, c) => a + (c.live ? c.nodes_held : 0), 0);
  return `${table(CONTROLLERS_HEADERS, rows)}${live} of ${items.length} live; ${owned} nodes owned, ${held} held\n`;
}

export const CONTROLLERS_HELP = `
Columns:
  NAME       the controller's name (its certificate controller/<name>)
  LIVE       yes while its lease is ahead of the database's clock: it owns its nodes and
             pushes to them; no once it stopped renewing (killed, stopped, or cut from the
             database): within 10 s its nodes are taken over by the live ones (docs/several-controllers.md)
  OWNED      nodes whose ownership names it (only the owner pushes to a node)
  HELD       of those, the ones it has a push connection up to, as it last reported
             (- when it is not live: what it reported then no longer holds)
  HEARTBEAT  how long ago it last recorded itself (every 2 s; 8 s old is dead), by this
             machine's clock against the database's
  API URL    where operators and agents reach it

The list comes from the shared database, so any controller answers with the same rows. A
controller on the embedded SQLite lists itself alone, owning every node. --controller-id must
name the controller --controller points at (e.g. c2); --json prints the API's JSON with
started_at and lease_until too.

Examples:
  $ herald controllers
  $ herald controllers --controller https://10.0.0.2:8443 --controller-id c2
  $ herald controllers --json
`;

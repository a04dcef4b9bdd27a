/**
 * What `herald demo --controllers N` sets up beyond the one-controller demo (docs/several-controllers.md): a PKI with
 * a certificate and signing key per controller, N controllers on one PostgreSQL database, the
 * wait until the nodes are spread over them and held; then the kill -9 of the controller that
 * owns the most nodes, and the watch of its nodes being taken over and pinged by their new
 * owners. The processes go through the demo's supervisor like every other.
 */
import { ownerOf } from '../../controller/fleet/rendezvous.js';
import type { ControllerView, ListEnvelope, NodeView } from '../../protocol/rest.js';
import type { DemoController } from './fixtures.js';
import { DemoFailure, sleep, type Child, type DemoSupervisor } from './supervisor.js';
import { clientFromOptions } from '../operator/client.js';
import { makePki } from '../testbed/pki.js';

/** How often the takeover watch asks the survivors. */
const TAKEOVER_POLL_MS = 100;

/** `c1` … `cN`. */
export function fleetNames(n: number): string[] {
  return Array.from({ length: n }, (_, i) => `c${i + 1}`);
}

export interface FleetController extends DemoController {
  name: string;
}

/** The CA and operator, a certificate and signing key per controller, one certificate per node. */
export async function makeFleetPki(pkiDir: string, controllers: string[], ids: string[]): Promise<void> {
  await makePki(pkiDir, { controllers, agents: ids });
}

/**
 * Starts one controller per name on `db`, all at once (each on port 0: the kernel picks, the
 * controller logs it); resolves when every one listens.
 */
export async function startControllers(
  sup: DemoSupervisor,
  o: { pkiDir: string; db: string; names: string[]; timeoutMs: number },
): Promise<FleetController[]> {
  const started = await Promise.all(
    o.names.map((name) => sup.bed.startController({ name, pki: o.pkiDir, db: o.db, timeoutMs: o.timeoutMs })),
  );
  return started.map((c) => ({
    name: c.name,
    url: c.url,
    proc: c.proc,
    api: clientFromOptions({ controller: c.url, pki: o.pkiDir, controllerId: c.name }, sup.env),
  }));
}

/** `GET /v1/controllers` from the first of `ctls` that answers. */
export async function controllersView(ctls: FleetController[]): Promise<ControllerView[]> {
  let last: unknown;
  for (const c of ctls) {
    try {
      return (await c.api.get<ListEnvelope<ControllerView>>('/v1/controllers')).items;
    } catch (err) {
      last = err;
    }
  }
  throw last instanceof Error ? last : new DemoFailure('no controller answered GET /v1/controllers');
}

/**
 * Waits until `live` controllers are live, own `nodeCount` nodes between them and each holds
 * (is connected to) every node it owns; resolves with that view.
 */
export async function waitSpread(
  sup: DemoSupervisor,
  ctls: FleetController[],
  o: { live: number; nodeCount: number; timeoutMs: number; watch: Child[] },
): Promise<ControllerView[]> {
  return sup.waitFor(
    `the ${o.nodeCount} nodes spread over ${o.live} live controllers and held`,
    o.timeoutMs,
    async () => {
      const view = await controllersView(ctls);
      const live = view.filter((c) => c.live);
      const counted =
        live.length === o.live &&
        live.every((c) => c.nodes_held === c.nodes_owned) &&
        live.reduce((a, c) => a + c.nodes_owned, 0) === o.nodeCount;
      if (!counted) return undefined;
      // settled, not only counted: every node with the owner rendezvous gives it among the live
      // controllers; before that a node may still move (and a kill chosen from this view would
      // name a controller that no longer owns it)
      const names = live.map((c) => c.name);
      const answering = ctls.find((c) => names.includes(c.name));
      const nodes = await answering?.api.get<ListEnvelope<NodeView>>('/v1/nodes');
      const settled =
        nodes !== undefined &&
        nodes.items.length === o.nodeCount &&
        nodes.items.every((n) => n.owner === ownerOf(n.id, names));
      return settled ? await controllersView(ctls) : undefined;
    },
    o.watch,
  );
}

/** The controller that owns the most nodes (the first by name on a tie). */
export function victimOf(view: ControllerView[]): ControllerView {
  const live = view.filter((c) => c.live);
  const v = [...live].sort((a, b) => b.nodes_owned - a.nodes_owned || a.name.localeCompare(b.name))[0];
  if (!v) throw new DemoFailure('no live controller to kill');
  return v;
}

/** The nodes `ctl` is connected to (only a node's owner pushes to it, so: the nodes it owns). */
export async function nodesHeldBy(ctl: FleetController): Promise<string[]> {
  const body = await ctl.api.get<ListEnvelope<NodeView>>('/v1/nodes');
  return body.items.filter((n) => n.push.connected).map((n) => n.id);
}

/** What happened to the killed controller's nodes, as the survivors tell it. */
export interface Takeover {
  victim: string;
  /** The nodes it owned (and held) just before the kill. */
  orphans: string[];
  /** When the kill -9 was sent (epoch ms). */
  killedAt: number;
  /** When `GET /v1/controllers` first showed it not live, owning nothing (epoch ms). */
  takenOverAt?: number;
  /** Per survivor, how many more nodes it owned then than before the kill. */
  gained?: Map<string, number>;
  /** Per orphan: the survivor connected to it whose wake-up it acknowledged after the kill, and when. */
  pinged: Map<string, { by: string; at: number }>;
}

/** SIGKILLs `victim`'s process group: `kill -9` of the controller and whatever it started. */
export function kill9(victim: FleetController): number {
  const pid = victim.proc.child.pid;
  if (pid === undefined) throw new DemoFailure(`controller ${victim.name} has no pid`);
  if (victim.proc.hasExited())
    throw new DemoFailure(`controller ${victim.name} (pid ${pid}) was not running when it was to be killed`);
  victim.proc.signal('SIGKILL');
  return pid;
}

/**
 * Asks the survivors until the victim is seen dead with its nodes taken over and every orphan
 * has acknowledged a wake-up from the survivor now connected to it, or until `untilMs`
 * (epoch ms); fills in `t` as it goes. Never throws for a survivor that does not answer once.
 */
export async function watchTakeover(
  survivors: FleetController[],
  before: ControllerView[],
  t: Takeover,
  untilMs: number,
): Promise<void> {
  const owned = new Map(before.map((c) => [c.name, c.nodes_owned]));
  while (Date.now() < untilMs) {
    if (t.takenOverAt === undefined) {
      const view = await controllersView(survivors).catch(() => undefined);
      const dead = view?.find((c) => c.name === t.victim);
      if (view && dead && !dead.live && dead.nodes_owned === 0) {
        t.takenOverAt = Date.now();
        t.gained = new Map(
          view.filter((c) => c.live).map((c) => [c.name, c.nodes_owned - (owned.get(c.name) ?? 0)] as const),
        );
      }
    }
    for (const s of survivors) {
      const body = await s.api.get<ListEnvelope<NodeView>>('/v1/nodes').catch(() => undefined);
      for (const n of body?.items ?? []) {
        if (!t.orphans.includes(n.id) || t.pinged.has(n.id) || !n.push.connected || !n.push.last_ack_at) continue;
        const at = Date.parse(n.push.last_ack_at);
        if (at >= t.killedAt) t.pinged.set(n.id, { by: s.name, at });
      }
    }
    if (t.takenOverAt !== undefined && t.pinged.size === t.orphans.length) return;
    await sleep(TAKEOVER_POLL_MS);
  }
}

/**
 * Live output at the controller (docs/api.md): a chunk an agent posts for its own deployment is kept
 * (once per sequence number; the newest OUTPUT_KEPT_PER_REVISION_BYTES per revision) and
 * published on `/v1/events` as an event of type `output`; operators read what is kept per stream
 * with `GET /v1/deployments/{id}/output`. The text comes masked from the agent (docs/architecture.md) and is
 * passed on as it came.
 */
import { HeraldError } from '../../protocol/errors.js';
import type { ClusterNodeView, ClusterView } from '../../protocol/rest.js';
import {
  lastLineOf,
  parseOutputChunk,
  type ClusterNodeOutputView,
  type DeploymentOutputView,
  type OutputChunkAck,
  type OutputEventView,
} from '../../protocol/output.js';
import type { EventBus } from './events.js';
import { renderOutput } from './output-view.js';
import type { Store } from '../store/store.js';

export class LiveOutputService {
  readonly #store: Store;
  readonly #events: EventBus;

  constructor(store: Store, events: EventBus) {
    this.#store = store;
    this.#events = events;
  }

  /**
   * An agent's chunk (the node already checked against the caller).
   * @throws HeraldError `invalid_request` (field), `empty_chunk`, `not_found` (not this node's
   *   deployment), `stale_revision` / `unknown_revision` / `output_closed` (field `revision`)
   */
  async post(node: string, deploymentId: string, body: unknown): Promise<OutputChunkAck> {
    const c = parseOutputChunk(body);
    const d = await this.#store.getDeployment(deploymentId);
    if (!d || d.node !== node) throw new HeraldError('not_found', `node ${node} has no deployment ${deploymentId}`);
    if (c.revision < d.current.revision)
      throw new HeraldError(
        'stale_revision',
        `revision ${c.revision} is older than the current ${d.current.revision}`,
        {
          field: 'revision',
        },
      );
    if (c.revision > d.current.revision)
      throw new HeraldError(
        'unknown_revision',
        `revision ${c.revision} is newer than the current ${d.current.revision}`,
        {
          field: 'revision',
        },
      );
    const { duplicate } = await this.#store.appendOutput({
      deploymentId,
      revision: c.revision,
      seq: c.seq,
      stream: c.stream,
      text: c.text,
      droppedBytes: c.dropped_bytes ?? 0,
    });
    if (!duplicate) {
      const e: OutputEventView = {
        deployment_id: deploymentId,
        node,
        revision: c.revision,
        stream: c.stream,
        seq: c.seq,
        text: c.text,
        ...(c.dropped_bytes === undefined ? {} : { dropped_bytes: c.dropped_bytes }),
      };
      this.#events.publish('output', e);
    }
    return { seq: c.seq, duplicate };
  }

  /**
   * What is kept of a revision's output (default the current revision).
   * @throws HeraldError `not_found`, `invalid_request` (field `revision`)
   */
  async get(deploymentId: string, revisionParam: string | null): Promise<DeploymentOutputView> {
    const d = await this.#store.getDeployment(deploymentId);
    if (!d) throw new HeraldError('not_found', `no deployment ${deploymentId}`);
    let revision = d.current.revision;
    let signalled = d.current.signalled;
    if (revisionParam !== null) {
      const r = Number(revisionParam);
      if (!Number.isSafeInteger(r) || r < 1)
        throw new HeraldError('invalid_request', 'revision must be a positive integer', { field: 'revision' });
      if (r !== revision) {
        const rev = (await this.#store.listRevisions(deploymentId)).find((x) => x.revision === r);
        if (!rev) throw new HeraldError('not_found', `deployment ${deploymentId} has no revision ${r}`);
        revision = r;
        signalled = rev.signalled;
      }
    }
    const streams = renderOutput(await this.#store.readOutput(deploymentId, revision));
    return { deployment_id: deploymentId, node: d.node, revision, signalled, ...streams };
  }

  /**
   * The cluster view with each node's last live output line (docs/api.md: every step shows when it
   * started, its deadline and its last output line): of the step in flight, else of the last one
   * it ran. One index seek per node.
   */
  async withLastLines<T extends ClusterView>(
    view: T,
  ): Promise<T & { nodes: Array<ClusterNodeView & ClusterNodeOutputView> }> {
    const stepOf = new Map(view.nodes.map((n) => [n.node, stepDeploymentOf(n)]));
    const ids = [...stepOf.values()].filter((x): x is string => x !== null);
    const last = ids.length === 0 ? new Map<string, string>() : await this.#store.lastOutput(ids);
    const decorate = (n: ClusterNodeView): ClusterNodeView & ClusterNodeOutputView => {
      const id = stepOf.get(n.node) ?? null;
      const text = id === null ? undefined : last.get(id);
      return { ...n, last_output_line: text === undefined ? null : lastLineOf(text) };
    };
    const out = { ...view, nodes: view.nodes.map(decorate) };
    if (Array.isArray((view as { nodegroups?: unknown }).nodegroups)) {
      (out as { nodegroups: Array<{ nodes: ClusterNodeView[] }> }).nodegroups = (
        view as unknown as { nodegroups: Array<{ nodes: ClusterNodeView[] }> }
      ).nodegroups.map((g) => ({ ...g, nodes: g.nodes.map(decorate) }));
    }
    return out;
  }
}

/** The deployment of a node's step in flight, else of the last step it started; null before any. */
function stepDeploymentOf(n: ClusterNodeView): string | null {
  if (n.phase === 'uninstalling') return n.uninstall_deployment_id;
  if (n.phase === 'installing') return n.install_deployment_id;
  if (n.phase === 'checking') return n.health_deployment_id ?? n.install_deployment_id;
  if (n.phase === 'pending') return null;
  const started: Array<[string | null, string | null]> = [
    [n.health_deployment_id, n.check_started_at],
    [n.install_deployment_id, n.install_started_at],
    [n.uninstall_deployment_id, n.uninstall_started_at],
  ];
  for (const [id, at] of started) if (id !== null && at !== null) return id;
  return n.install_deployment_id;
}

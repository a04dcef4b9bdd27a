/**
 * A node's deployment metadata (SPEC §5), shaped as Heat shapes it, built once per (node,
 * generation) and kept with its digest; only the small JWS is signed per response. Hidden input
 * values are in here on purpose: the agent needs them, and only that agent can read them.
 */
import { sha256b64url } from '../protocol/metadata.js';
import type { MetadataDocument, MetadataInput, MetadataItem } from '../protocol/heat.js';
import { METADATA_CACHE_ENTRIES } from '../protocol/limits.js';
import type { MetadataDeployment, MetadataSource } from './store.js';

export const SIGNAL_TRANSPORT = 'HERALD_SIGNAL';

export interface BuiltMetadata {
  node: string;
  generation: number;
  body: Buffer;
  sha256: string;
}

/** Heat's descriptions of the derived inputs. */
const DERIVED_DESCRIPTIONS: Record<string, string> = {
  deploy_server_id: 'ID of the server being deployed to',
  deploy_action: 'Name of the current action being deployed',
  deploy_stack_id: 'ID of the stack this deployment belongs to',
  deploy_resource_name: 'Name of this deployment resource in the stack',
  deploy_signal_transport: 'How the server should signal to heat with the deployment output values.',
  deploy_signal_id: 'ID of signal to use for signaling output values',
  deploy_signal_verb: 'HTTP verb to use for signaling outputvalues',
};

/**
 * The document for `src`. `signalUrl(node, deploymentId)` gives `deploy_signal_id`.
 * Sorted by name (the deployment's, else its config's), then creation time, then id.
 */
export function buildMetadataDocument(
  src: MetadataSource,
  signalUrl: (node: string, deploymentId: string) => string,
  hiddenOf: (d: MetadataDeployment) => ReadonlySet<string>,
): MetadataDocument {
  const items: MetadataItem[] = src.entries.map(({ deployment: d, config: c, cluster }) => {
    const r = d.current;
    const name = d.name ?? c.name;
    const inputs: MetadataInput[] = [];
    const declared = new Set<string>();
    const hidden = hiddenOf(d);
    for (const i of c.inputs) {
      declared.add(i.name);
      const v = Object.hasOwn(r.inputValues, i.name) ? r.inputValues[i.name] : i.default;
      const input: MetadataInput = { name: i.name, type: i.type, value: v ?? (i.type === 'String' ? '' : null) };
      if (i.description !== undefined) input.description = i.description;
      if (hidden.has(i.name)) input.hidden = true;
      inputs.push(input);
    }
    for (const [k, v] of Object.entries(r.inputValues)) {
      if (declared.has(k)) continue;
      const input: MetadataInput = { name: k, type: 'String', value: typeof v === 'string' ? v : JSON.stringify(v) };
      if (hidden.has(k)) input.hidden = true;
      inputs.push(input);
    }
    const derived: Record<string, string> = {
      deploy_server_id: d.node,
      deploy_action: r.action,
      deploy_stack_id: cluster ? `${cluster.name}/${cluster.id}` : `herald/${d.id}`,
      deploy_resource_name: name,
      deploy_signal_transport: SIGNAL_TRANSPORT,
      deploy_signal_id: signalUrl(d.node, d.id),
      deploy_signal_verb: 'POST',
    };
    for (const [k, v] of Object.entries(derived))
      inputs.push({ name: k, type: 'String', value: v, description: DERIVED_DESCRIPTIONS[k]! });
    return {
      id: r.itemId,
      name,
      group: c.group,
      creation_time: d.createdAt,
      config: c.config,
      inputs,
      outputs: c.outputs.map((o) => ({
        name: o.name,
        type: o.type,
        error_output: o.error_output,
        ...(o.description !== undefined ? { description: o.description } : {}),
      })),
      options: c.options,
      deployment_id: d.id,
      revision: r.revision,
      signalled: r.signalled,
    };
  });
  items.sort(
    (a, b) => cmp(a.name, b.name) || cmp(a.creation_time, b.creation_time) || cmp(a.deployment_id, b.deployment_id),
  );
  return { node: src.node.id, generation: src.node.generation, deployments: items };
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Built bodies by node, for their current generation only; least recently used dropped first. */
export class MetadataCache {
  readonly #max: number;
  readonly #entries = new Map<string, BuiltMetadata>();

  constructor(max = METADATA_CACHE_ENTRIES) {
    this.#max = max;
  }

  /** The cached body for (node, generation), if any (marked recently used). */
  peek(node: string, generation: number): BuiltMetadata | undefined {
    const hit = this.#entries.get(node);
    if (!hit || hit.generation !== generation) return undefined;
    this.#entries.delete(node);
    this.#entries.set(node, hit);
    return hit;
  }

  /** Encodes `doc`, keeps it for its node unless a newer generation is kept already, and returns it. */
  put(doc: MetadataDocument): BuiltMetadata {
    const body = Buffer.from(JSON.stringify(doc), 'utf8');
    const built: BuiltMetadata = { node: doc.node, generation: doc.generation, body, sha256: sha256b64url(body) };
    const had = this.#entries.get(doc.node);
    if (had && had.generation > built.generation) return built; // (two builds raced; the newer stays)
    this.#entries.delete(doc.node);
    this.#entries.set(doc.node, built);
    while (this.#entries.size > this.#max) {
      const oldest = this.#entries.keys().next();
      if (oldest.done) break;
      this.#entries.delete(oldest.value);
    }
    return built;
  }

  /** The body for (node, generation), building it with `build` when not cached. */
  get(node: string, generation: number, build: () => MetadataDocument): BuiltMetadata {
    return this.peek(node, generation) ?? this.put(build());
  }

  delete(node: string): void {
    this.#entries.delete(node);
  }

  get size(): number {
    return this.#entries.size;
  }
}

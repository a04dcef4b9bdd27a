/**
 * A node's deployment metadata (docs/protocol.md), shaped as Heat shapes it, encoded once per (node,
 * generation) and kept with its digest; only the small JWS is signed per response. Hidden input
 * values are in here on purpose: the agent needs them, and only that agent can read them.
 *
 * The body is written as JSON text directly, not built as objects and then stringified: what a
 * config contributes to every item it feeds (its group, script, input declarations, outputs and
 * options) is encoded once per config record and reused by every node's document, so a fetch
 * encodes only the node's own values. The text is exactly `JSON.stringify` of the document the
 * types in protocol/heat.ts describe (test/controller/metadata-encoder.test.ts holds the two
 * side by side).
 */
import { sha256b64url } from '../../protocol/metadata.js';
import { METADATA_CACHE_ENTRIES } from '../../protocol/limits.js';
import type { ConfigRecord } from '../model/records.js';
import type { MetadataDeployment, MetadataSource } from '../store/store.js';

export const SIGNAL_TRANSPORT = 'HERALD_SIGNAL';

export interface BuiltMetadata {
  node: string;
  generation: number;
  body: Buffer;
  sha256: string;
}

/** Heat's derived inputs, in Heat's order, with its descriptions. */
const DERIVED_DESCRIPTIONS = {
  deploy_server_id: 'ID of the server being deployed to',
  deploy_action: 'Name of the current action being deployed',
  deploy_stack_id: 'ID of the stack this deployment belongs to',
  deploy_resource_name: 'Name of this deployment resource in the stack',
  deploy_signal_transport: 'How the server should signal to heat with the deployment output values.',
  deploy_signal_id: 'ID of signal to use for signaling output values',
  deploy_signal_verb: 'HTTP verb to use for signaling outputvalues',
} as const;
type Derived = keyof typeof DERIVED_DESCRIPTIONS;

const J = JSON.stringify;

/** `{"name":<k>,"type":"String","value":` and `,"description":<text>}` of each derived input. */
const DERIVED_PARTS = Object.fromEntries(
  Object.entries(DERIVED_DESCRIPTIONS).map(([k, d]) => [
    k,
    { head: `{"name":${J(k)},"type":"String","value":`, tail: `,"description":${J(d)}}` },
  ]),
) as Record<Derived, { head: string; tail: string }>;

/** What a config puts in every item it feeds, as JSON text. */
interface ConfigParts {
  /** `,"group":<group>,"creation_time":` */
  group: string;
  /** `,"config":<config>,"inputs":[` */
  config: string;
  inputs: DeclaredInput[];
  declared: ReadonlySet<string>;
  /** `],"outputs":[…],"options":{…},"deployment_id":` */
  tail: string;
}

interface DeclaredInput {
  name: string;
  /** `{"name":<name>,"type":<type>` */
  head: string;
  /** The value when the revision gives none: the default, else `empty`. */
  fallback: string;
  /** The value when the revision's or the default is null: '' for a String, null otherwise. */
  empty: string;
  /** `,"description":<text>` or '' */
  description: string;
}

/** Configs never change: a record's parts are encoded the first time a document needs them. */
const partsOf = new WeakMap<ConfigRecord, ConfigParts>();

function configParts(c: ConfigRecord): ConfigParts {
  let p = partsOf.get(c);
  if (p !== undefined) return p;
  const inputs = c.inputs.map((i): DeclaredInput => {
    const empty = i.type === 'String' ? '""' : 'null';
    return {
      name: i.name,
      head: `{"name":${J(i.name)},"type":${J(i.type)}`,
      fallback: i.default === undefined || i.default === null ? empty : J(i.default),
      empty,
      description: i.description !== undefined ? `,"description":${J(i.description)}` : '',
    };
  });
  const outputs = c.outputs.map((o) => ({
    name: o.name,
    type: o.type,
    error_output: o.error_output,
    ...(o.description !== undefined ? { description: o.description } : {}),
  }));
  p = {
    group: `${member('group', c.group)},"creation_time":`,
    config: `${member('config', c.config)},"inputs":[`,
    inputs,
    declared: new Set(c.inputs.map((i) => i.name)),
    tail: `]${member('outputs', outputs)}${member('options', c.options)},"deployment_id":`,
  };
  partsOf.set(c, p);
  return p;
}

/** `,"<key>":<value>`, or nothing where JSON.stringify leaves the member out (an undefined value). */
function member(key: string, value: unknown): string {
  const v = J(value) as string | undefined;
  return v === undefined ? '' : `,${J(key)}:${v}`;
}

/**
 * The document for `src` as JSON text. `signalUrl(node, deploymentId)` gives `deploy_signal_id`;
 * `hiddenOf(d)` the names of the inputs to flag hidden. Items sorted by name (the deployment's,
 * else its config's), then creation time, then id.
 */
export function encodeMetadataDocument(
  src: MetadataSource,
  signalUrl: (node: string, deploymentId: string) => string,
  hiddenOf: (d: MetadataDeployment) => ReadonlySet<string>,
): string {
  const items = src.entries.map(({ deployment: d, config: c, cluster }) => {
    const r = d.current;
    const name = d.name ?? c.name;
    const p = configParts(c);
    const hidden = hiddenOf(d);
    const values = r.inputValues;
    let inputs = '';
    const sep = (): string => (inputs === '' ? '' : ',');
    for (const i of p.inputs) {
      let v: string | undefined;
      if (Object.hasOwn(values, i.name)) {
        const given = values[i.name];
        v = given === undefined || given === null ? i.empty : J(given);
      } else v = i.fallback;
      inputs += `${sep()}${i.head}${v === undefined ? '' : `,"value":${v}`}${i.description}${hidden.has(i.name) ? ',"hidden":true}' : '}'}`;
    }
    for (const k in values) {
      if (!Object.hasOwn(values, k) || p.declared.has(k) || Object.hasOwn(DERIVED_PARTS, k)) continue;
      const v = values[k];
      const text = (typeof v === 'string' ? v : J(v)) as string | undefined;
      inputs += `${sep()}{"name":${J(k)},"type":"String"${text === undefined ? '' : `,"value":${J(text)}`}${hidden.has(k) ? ',"hidden":true}' : '}'}`;
    }
    const derived: Record<Derived, string> = {
      deploy_server_id: heatOwn(values, 'deploy_server_id') ?? d.node,
      deploy_action: r.action,
      deploy_stack_id:
        heatOwn(values, 'deploy_stack_id') ?? (cluster ? `${cluster.name}/${cluster.id}` : `herald/${d.id}`),
      deploy_resource_name: heatOwn(values, 'deploy_resource_name') ?? name,
      deploy_signal_transport: SIGNAL_TRANSPORT,
      deploy_signal_id: signalUrl(d.node, d.id),
      deploy_signal_verb: 'POST',
    };
    for (const k in derived) {
      const part = DERIVED_PARTS[k as Derived];
      inputs += `${sep()}${part.head}${J(derived[k as Derived])}${part.tail}`;
    }
    const json =
      `{"id":${J(r.itemId)},"name":${J(name)}${p.group}${J(d.createdAt)}${p.config}${inputs}${p.tail}` +
      `${J(d.id)},"revision":${J(r.revision)},"signalled":${r.signalled ? 'true' : 'false'}}`;
    return { name, createdAt: d.createdAt, id: d.id, json };
  });
  items.sort((a, b) => cmp(a.name, b.name) || cmp(a.createdAt, b.createdAt) || cmp(a.id, b.id));
  let deployments = '';
  for (const it of items) deployments += deployments === '' ? it.json : `,${it.json}`;
  return `{"node":${J(src.node.id)},"generation":${J(src.node.generation)},"deployments":[${deployments}]}`;
}

/**
 * Heat's own value of a derived input, kept in the values of a deployment Heat made (heat.ts):
 * the hook sees the server, stack and resource Heat named. The signal's inputs are always Herald's.
 */
function heatOwn(values: Record<string, unknown>, k: 'deploy_server_id' | 'deploy_stack_id' | 'deploy_resource_name') {
  const v = Object.hasOwn(values, k) ? values[k] : undefined;
  return typeof v === 'string' ? v : undefined;
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

  /** The body kept for the node, whatever its generation (its order of use unchanged). */
  newest(node: string): BuiltMetadata | undefined {
    return this.#entries.get(node);
  }

  /** Keeps `json`, the document of (node, generation), with its digest unless a newer generation is kept already, and returns it. */
  put(node: string, generation: number, json: string): BuiltMetadata {
    const body = Buffer.from(json, 'utf8');
    const built: BuiltMetadata = { node, generation, body, sha256: sha256b64url(body) };
    const had = this.#entries.get(node);
    if (had && had.generation > built.generation) return built; // (two builds raced; the newer stays)
    this.#entries.delete(node);
    this.#entries.set(node, built);
    while (this.#entries.size > this.#max) {
      const oldest = this.#entries.keys().next();
      if (oldest.done) break;
      this.#entries.delete(oldest.value);
    }
    return built;
  }

  delete(node: string): void {
    this.#entries.delete(node);
  }

  get size(): number {
    return this.#entries.size;
  }
}

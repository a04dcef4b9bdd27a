/**
 * Heat's metadata document for a server, as Heat writes it to the object store (docs/heat.md):
 * `{"deployments": [<derived config>, ...], "os-collect-config": {...}}`, each item a Heat
 * SoftwareDeployment's derived config: the config, its declared inputs with their values, and the
 * inputs Heat derives (`deploy_*`). Read here into what a Herald deployment is made of. Pure.
 */
import { DEPLOY_ACTIONS, type DeployAction, INPUT_TYPES, type InputType } from '../../protocol/heat.js';
import { HeraldError } from '../../protocol/errors.js';
import { withinJsonDepth } from '../../protocol/json-depth.js';
import { MAX_JSON_DEPTH_LEVELS } from '../../protocol/limits.js';

/** How a deployment's result reaches Heat: written to a signal object of this store, or not at all. */
export const HEAT_SIGNAL_TRANSPORTS = ['TEMP_URL_SIGNAL', 'NO_SIGNAL'] as const;

export interface HeatInputDecl {
  name: string;
  type: InputType;
  description?: string;
  default?: unknown;
}

export interface HeatOutputDecl {
  name: string;
  type: InputType;
  description?: string;
  error_output: boolean;
}

export interface HeatItem {
  /** The derived config's id: new whenever Heat changes anything of the item. */
  id: string;
  name: string;
  group: string;
  config: unknown;
  inputs: HeatInputDecl[];
  /** The declared inputs' values. */
  values: Record<string, unknown>;
  outputs: HeatOutputDecl[];
  options: Record<string, unknown>;
  action: DeployAction;
  serverId: string;
  stackId: string;
  resourceName: string;
  /**
   * One Heat deployment across its updates: its signal object's path (`deploy_signal_id` stays
   * the same through updates, and a resource Heat replaces, say after a failed update, gets a new
   * one), else `<deploy_stack_id>/<deploy_resource_name>`.
   */
  key: string;
  /** The signal TempURL (`deploy_signal_id`), or null under NO_SIGNAL. */
  signalUrl: string | null;
}

/** Heat's derived inputs: read into the item, never kept as inputs (the credential ones dropped). */
const DERIVED = /^deploy_[a-z_]+$/;

function bad(field: string, what: string): HeraldError {
  return new HeraldError('heat_metadata_invalid', `${field}: ${what}`, { field });
}

function str(v: unknown, field: string, optional = false): string {
  if (typeof v === 'string') return v;
  if (optional && (v === undefined || v === null)) return '';
  throw bad(field, 'must be a string');
}

function type(v: unknown, field: string): InputType {
  if (v === undefined || v === null) return 'String';
  if (typeof v === 'string' && (INPUT_TYPES as readonly string[]).includes(v)) return v as InputType;
  throw bad(field, `must be one of ${INPUT_TYPES.join(', ')}`);
}

function obj(v: unknown, field: string): Record<string, unknown> {
  if (typeof v === 'object' && v !== null && !Array.isArray(v)) return v as Record<string, unknown>;
  throw bad(field, 'must be an object');
}

/**
 * The items of Heat's metadata document `doc` (parsed JSON).
 * @throws HeraldError heat_metadata_invalid (field: where)
 */
export function readHeatMetadata(doc: unknown): HeatItem[] {
  const d = obj(doc, 'metadata');
  if (d.deployments === undefined) return [];
  if (!Array.isArray(d.deployments)) throw bad('deployments', 'must be a list');
  const items = d.deployments.map((raw, i) => readItem(raw, `deployments.${i}`));
  // two items of one key (a NO_SIGNAL resource and its replacement): told apart by their order
  const seen = new Map<string, number>();
  for (const it of items) {
    const n = (seen.get(it.key) ?? 0) + 1;
    seen.set(it.key, n);
    if (n > 1) it.key = `${it.key}#${n}`;
  }
  return items;
}

function readItem(raw: unknown, at: string): HeatItem {
  const o = obj(raw, at);
  const derived: Record<string, string> = {};
  const inputs: HeatInputDecl[] = [];
  const values: Record<string, unknown> = {};
  const list = o.inputs ?? [];
  if (!Array.isArray(list)) throw bad(`${at}.inputs`, 'must be a list');
  for (const [j, rawIn] of list.entries()) {
    const f = `${at}.inputs.${j}`;
    const inp = obj(rawIn, f);
    const name = str(inp.name, `${f}.name`);
    if (DERIVED.test(name)) {
      if (typeof inp.value === 'string') derived[name] = inp.value;
      continue;
    }
    const decl: HeatInputDecl = { name, type: type(inp.type, `${f}.type`) };
    if (typeof inp.description === 'string' && inp.description !== '') decl.description = inp.description;
    if (inp.default !== undefined && inp.default !== null && inp.default !== '') decl.default = inp.default;
    inputs.push(decl);
    if (!Object.hasOwn(inp, 'value')) continue;
    // as the API's input values: a deeper one would overflow the stack of whatever serialises it
    if (!withinJsonDepth(inp.value)) throw bad(`${f}.value`, `is nested deeper than ${MAX_JSON_DEPTH_LEVELS} levels`);
    values[name] = inp.value;
  }
  const outList = o.outputs ?? [];
  if (!Array.isArray(outList)) throw bad(`${at}.outputs`, 'must be a list');
  const outputs = outList.map((rawOut, j): HeatOutputDecl => {
    const f = `${at}.outputs.${j}`;
    const out = obj(rawOut, f);
    const decl: HeatOutputDecl = {
      name: str(out.name, `${f}.name`),
      type: type(out.type, `${f}.type`),
      error_output: out.error_output === true,
    };
    if (typeof out.description === 'string' && out.description !== '') decl.description = out.description;
    return decl;
  });
  const action = derived.deploy_action ?? 'UPDATE';
  if (!(DEPLOY_ACTIONS as readonly string[]).includes(action))
    throw bad(`${at}.inputs.deploy_action`, `must be one of ${DEPLOY_ACTIONS.join(', ')}`);
  const transport = derived.deploy_signal_transport ?? 'NO_SIGNAL';
  if (!(HEAT_SIGNAL_TRANSPORTS as readonly string[]).includes(transport))
    throw bad(
      `${at}.inputs.deploy_signal_transport`,
      `${transport} is not served: use ${HEAT_SIGNAL_TRANSPORTS.join(' or ')} (docs/heat.md)`,
    );
  const signalUrl = transport === 'TEMP_URL_SIGNAL' ? (derived.deploy_signal_id ?? null) : null;
  if (transport === 'TEMP_URL_SIGNAL' && !signalUrl) throw bad(`${at}.inputs.deploy_signal_id`, 'is required');
  const stackId = derived.deploy_stack_id;
  const resourceName = derived.deploy_resource_name;
  if (!stackId) throw bad(`${at}.inputs.deploy_stack_id`, 'is required');
  if (!resourceName) throw bad(`${at}.inputs.deploy_resource_name`, 'is required');
  const options = o.options === undefined || o.options === null ? {} : obj(o.options, `${at}.options`);
  return {
    id: str(o.id, `${at}.id`),
    name: str(o.name, `${at}.name`, true) || resourceName,
    group: str(o.group, `${at}.group`, true) || 'Heat::Ungrouped',
    config: o.config ?? '',
    inputs,
    values,
    outputs,
    options,
    action: action as DeployAction,
    serverId: derived.deploy_server_id ?? '',
    stackId,
    resourceName,
    key: signalUrl ? signalKey(signalUrl) : `${stackId}/${resourceName}`,
    signalUrl,
  };
}

/** A signal URL without its query (the TempURL's signature): the signal object's address. */
function signalKey(url: string): string {
  const q = url.indexOf('?');
  return q < 0 ? url : url.slice(0, q);
}

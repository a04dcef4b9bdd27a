/**
 * What the API accepts: zod schemas for every request body, the name rules of docs/architecture.md (from
 * protocol/heat.ts), and the coercion of input values to their declared Heat types. Every
 * refusal is a HeraldError with the offending field as a dotted path (`input_values.port`).
 * Messages never quote a value: an input may be hidden.
 */
import { z } from 'zod';
import { HeraldError, RefusalError } from '../../protocol/errors.js';
import {
  checkGroupName,
  checkInputName,
  checkOutputName,
  DEPLOY_ACTIONS,
  DERIVED_INPUT_NAMES,
  INPUT_TYPES,
  STANDARD_OUTPUT_NAMES,
  type DeployAction,
} from '../../protocol/heat.js';
import { NAME_RE } from '../../protocol/identity.js';
import { withinJsonDepth } from '../../protocol/json-depth.js';
import { MAX_JSON_DEPTH_LEVELS, MAX_RESTART_PAUSE_S, MAX_ROLLOUT_DEADLINE_S } from '../../protocol/limits.js';
import type { ConfigInput, ConfigOutput, NewConfig } from '../store/store.js';
import { coerceValue } from '../model/inputs.js';
export { coerceInputValues, coerceValue, mergeInputValues } from '../model/inputs.js';

const MAX_NAME_CHARS = 255;
const MAX_DESCRIPTION_CHARS = 4096;
const MAX_IO_ENTRIES = 256;
const MAX_URL_CHARS = 2048;
/** Largest `options.timeout` a config may ask for: one day. */
const MAX_TIMEOUT_S = 86_400;

// biome-ignore lint/suspicious/noControlCharactersInRegex: the pattern exists to reject control characters in display names
const NO_CONTROL_CHARS_RE = /^[^\u0000-\u001f\u007f]+$/;
const displayName = z
  .string()
  .min(1)
  .max(MAX_NAME_CHARS)
  .regex(NO_CONTROL_CHARS_RE, 'must not contain control characters');
const nodeId = z.string().regex(NAME_RE, `must match ${NAME_RE.source}`);
const resourceId = z.string().min(1).max(64);
/** A free-form JSON value: nested at most MAX_JSON_DEPTH_LEVELS (docs/api.md). */
const TOO_DEEP = `is nested deeper than ${MAX_JSON_DEPTH_LEVELS} levels`;
const jsonValue = z.unknown().refine((v) => withinJsonDepth(v), TOO_DEEP);
const valuesRecord = z.record(z.string(), jsonValue);
const action = z.enum(DEPLOY_ACTIONS);

export const nodeCreateSchema = z.strictObject({
  id: nodeId,
  endpoint: z.string().max(MAX_URL_CHARS).nullable().optional(),
  /** Checked by protocol/access.ts checkLabels. */
  labels: z.unknown().optional(),
});

/** `PATCH /v1/nodes/{id}`: labels to set (a value) or remove (null), checked by protocol/access.ts checkLabels. */
export const nodePatchSchema = z.strictObject({ labels: z.unknown() });

export const endpointSchema = z.strictObject({ url: z.string().max(MAX_URL_CHARS) });

const inputSchema = z.object({
  name: z.string(),
  type: z.enum(INPUT_TYPES).default('String'),
  default: jsonValue.optional(),
  description: z.string().max(MAX_DESCRIPTION_CHARS).optional(),
  hidden: z.boolean().optional(),
});

const outputSchema = z.object({
  name: z.string(),
  type: z.enum(INPUT_TYPES).default('String'),
  error_output: z.boolean().default(false),
  description: z.string().max(MAX_DESCRIPTION_CHARS).optional(),
  hidden: z.boolean().optional(),
});

export const configCreateSchema = z.strictObject({
  name: displayName,
  group: z.string(),
  config: z
    .unknown()
    .refine((v) => v !== undefined && v !== null, 'is required')
    .refine((v) => withinJsonDepth(v), TOO_DEEP),
  inputs: z.array(inputSchema).max(MAX_IO_ENTRIES).optional(),
  outputs: z.array(outputSchema).max(MAX_IO_ENTRIES).optional(),
  options: valuesRecord.optional(),
});

export const deploymentCreateSchema = z.strictObject({
  node: nodeId,
  config_id: resourceId,
  name: displayName.optional(),
  actions: z
    .array(action)
    .max(DEPLOY_ACTIONS.length * 2)
    .optional(),
  action: action.optional(),
  input_values: valuesRecord.optional(),
});

export const deploymentPatchSchema = z.strictObject({
  input_values: valuesRecord.optional(),
  action: action.optional(),
});

/** Signals are lenient about extra keys: an agent of a later version may send more. */
export const signalSchema = z.object({
  revision: z.number().int().min(1),
  deploy_status_code: z.number().int(),
  deploy_stdout: z.string().default(''),
  deploy_stderr: z.string().default(''),
  outputs: valuesRecord.default({}),
  status_reason: z.string().max(MAX_DESCRIPTION_CHARS).optional(),
});

/** A node group's name follows the name rule of docs/configuration.md. */
const nodegroupName = z.string().regex(NAME_RE, `must match ${NAME_RE.source}`);

/** One group of `POST /v1/clusters` `nodegroups` (docs/api.md). */
export const nodegroupSchema = z.strictObject({
  name: nodegroupName,
  role: z.enum(['master', 'worker']).default('worker'),
  nodes: z.array(nodeId).min(1).max(100_000),
  install_config_id: resourceId.optional(),
  uninstall_config_id: resourceId.optional(),
  input_values: valuesRecord.optional(),
});

export type NodegroupBody = z.output<typeof nodegroupSchema>;

/** `nodes` (one group 'default-worker') or `nodegroups`, exactly one of them (service.ts checks which). */
export const clusterCreateSchema = z.strictObject({
  name: displayName,
  nodes: z.array(nodeId).min(1).max(100_000).optional(),
  nodegroups: z.array(nodegroupSchema).min(1).max(1_000).optional(),
  install_config_id: resourceId,
  uninstall_config_id: resourceId,
  input_values: valuesRecord.optional(),
});

/** `max_unavailable`: a count, or a percentage of each group's nodes, 1% to 100%. */
const maxUnavailable = z.union([
  z.number().int().min(1),
  z
    .string()
    .regex(/^[0-9]{1,3}%$/, 'must be a count or a percentage such as "25%"')
    .refine((p) => Number(p.slice(0, -1)) >= 1 && Number(p.slice(0, -1)) <= 100, 'must be between 1% and 100%'),
]);

/** `canary`: a count of nodes per group, or a percentage of the nodes the rollout changes in each (1% to 100%). */
const canary = z.union([
  z.number().int().min(0),
  z
    .string()
    .regex(/^[0-9]{1,3}%$/, 'must be a count or a percentage such as "10%"')
    .refine((p) => Number(p.slice(0, -1)) >= 1 && Number(p.slice(0, -1)) <= 100, 'must be between 1% and 100%'),
]);

/** An HTTPS URL without credentials (a gate's: docs/api.md `gate`); credentials would be kept and shown. */
const gateUrl = z
  .string()
  .max(MAX_URL_CHARS)
  .refine((u) => {
    try {
      const x = new URL(u);
      return x.protocol === 'https:' && x.username === '' && x.password === '';
    } catch {
      return false;
    }
  }, 'must be an https:// URL without credentials');

/** `gate` (docs/api.md): `url`, or `prometheus` with `query` (service.ts checks which). */
const gateSchema = z.strictObject({
  url: gateUrl.optional(),
  prometheus: gateUrl.optional(),
  query: z.string().min(1).max(MAX_DESCRIPTION_CHARS).optional(),
  fail_open: z.boolean().optional(),
});

export type GateBody = z.output<typeof gateSchema>;

const deadlineS = z.number().int().min(1).max(MAX_ROLLOUT_DEADLINE_S);

/** A rollout's options (docs/api.md "Rollouts"): a restart's and an upgrade's; every key optional. */
const rolloutFields = {
  max_unavailable: maxUnavailable.optional(),
  pause_s: z.number().min(0).max(MAX_RESTART_PAUSE_S).optional(),
  max_failures: z.number().int().min(0).optional(),
  health_config_id: resourceId.optional(),
  canary: canary.optional(),
  auto_promote_s: z.number().int().min(0).max(MAX_ROLLOUT_DEADLINE_S).optional(),
  on_failure: z.enum(['pause', 'abort', 'revert']).optional(),
  node_deadline_s: deadlineS.optional(),
  progress_deadline_s: deadlineS.optional(),
  gate: gateSchema.optional(),
  force: z.boolean().optional(),
  dry_run: z.boolean().optional(),
};

export type RolloutBody = { [K in keyof typeof rolloutFields]?: z.output<(typeof rolloutFields)[K]> };

/** `PATCH /v1/clusters/{id}/actions/restart` (docs/api.md); every key optional. */
export const restartSchema = z.strictObject({
  ...rolloutFields,
  nodegroups: z.array(nodegroupName).min(1).max(1_000).optional(),
});

/** `PATCH /v1/clusters/{id}` and `PATCH /v1/clusters/{id}/nodegroups/{name}` (docs/api.md "Upgrades"). */
export const upgradeSchema = z.strictObject({
  ...rolloutFields,
  install_config_id: resourceId.optional(),
  uninstall_config_id: resourceId.optional(),
  input_values: valuesRecord.optional(),
});

/** `PATCH /v1/clusters/{id}/actions/undo` (docs/api.md): `revision` default the last stable one before the cluster's. */
export const undoSchema = z.strictObject({
  ...rolloutFields,
  revision: z.number().int().min(1).optional(),
});

/**
 * Parses `body` with `schema`, or throws `invalid_request` naming the first bad field.
 * @throws HeraldError invalid_request
 */
export function parseBody<S extends z.ZodType>(schema: S, body: unknown): z.output<S> {
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const path = issue.path.map(String);
  if (issue.code === 'unrecognized_keys' && issue.keys[0] !== undefined) path.push(issue.keys[0]);
  const field = path.join('.');
  const what = issue.code === 'unrecognized_keys' ? 'is not a known field' : issue.message;
  throw new HeraldError('invalid_request', field ? `${field}: ${what}` : what, field ? { field } : {});
}

// ---- configs --------------------------------------------------------------------------------

/**
 * Checks a parsed config: group, tool, input and output names (docs/architecture.md), no derived or
 * duplicate names, defaults that fit their types, a component config's shape, options.timeout.
 * @throws RefusalError bad_name | forbidden_input | bad_config; HeraldError invalid_request | bad_input_value
 */
export function checkConfig(c: z.output<typeof configCreateSchema>): NewConfig {
  checkGroupName(c.group, 'group');
  const inputs: ConfigInput[] = [];
  const seen = new Set<string>();
  for (const [i, inp] of (c.inputs ?? []).entries()) {
    const field = `inputs.${i}.name`;
    checkInputName(inp.name, field);
    if ((DERIVED_INPUT_NAMES as readonly string[]).includes(inp.name))
      throw new RefusalError('bad_name', `${inp.name} is derived by Herald`, { field });
    if (seen.has(inp.name)) throw new HeraldError('invalid_request', `input ${inp.name} is declared twice`, { field });
    seen.add(inp.name);
    const out: ConfigInput = { name: inp.name, type: inp.type };
    if (inp.default !== undefined && inp.default !== null)
      out.default = coerceValue(inp.type, inp.default, `inputs.${i}.default`);
    if (inp.description !== undefined) out.description = inp.description;
    if (inp.hidden !== undefined) out.hidden = inp.hidden;
    inputs.push(out);
  }
  const outputs: ConfigOutput[] = [];
  const seenOut = new Set<string>();
  for (const [i, o] of (c.outputs ?? []).entries()) {
    const field = `outputs.${i}.name`;
    checkOutputName(o.name, field);
    if ((STANDARD_OUTPUT_NAMES as readonly string[]).includes(o.name))
      throw new RefusalError('bad_name', `${o.name} is reported by every signal`, { field });
    if (seenOut.has(o.name)) throw new HeraldError('invalid_request', `output ${o.name} is declared twice`, { field });
    seenOut.add(o.name);
    const out: ConfigOutput = { name: o.name, type: o.type, error_output: o.error_output };
    if (o.description !== undefined) out.description = o.description;
    if (o.hidden === true) out.hidden = true;
    outputs.push(out);
  }
  const options = c.options ?? {};
  if (options.timeout !== undefined) {
    const t = options.timeout;
    if (typeof t !== 'number' || !Number.isFinite(t) || t <= 0 || t > MAX_TIMEOUT_S) {
      throw new HeraldError(
        'invalid_request',
        `options.timeout must be a number of seconds from 1 to ${MAX_TIMEOUT_S}`,
        { field: 'options.timeout' },
      );
    }
  }
  if (c.group === 'script' && typeof c.config !== 'string') {
    throw new RefusalError('bad_config', 'a script config is the script text (a string)', { field: 'config' });
  }
  if (c.group === 'component') checkComponentConfig(c.config);
  return { name: c.name, group: c.group, config: c.config, inputs, outputs, options };
}

/** `{"configs":[{"actions":[..],"tool":"script","config":".."}, ..]}` (docs/protocol.md). */
function checkComponentConfig(config: unknown): void {
  const configs = (config as { configs?: unknown } | null)?.configs;
  if (typeof config !== 'object' || config === null || Array.isArray(config) || !Array.isArray(configs)) {
    throw new RefusalError(
      'bad_config',
      'a component config is {"configs":[{"actions":[..],"tool":"..","config":..}, ..]}',
      { field: 'config.configs' },
    );
  }
  for (const [i, sub] of configs.entries()) {
    const s = sub as { actions?: unknown; tool?: unknown; config?: unknown } | null;
    if (typeof s !== 'object' || s === null)
      throw new RefusalError('bad_config', 'each component entry is an object', { field: `config.configs.${i}` });
    checkGroupName(s.tool, `config.configs.${i}.tool`);
    if (!Array.isArray(s.actions) || !s.actions.every((a) => (DEPLOY_ACTIONS as readonly unknown[]).includes(a))) {
      throw new RefusalError('bad_config', `actions must be a list of ${DEPLOY_ACTIONS.join(', ')}`, {
        field: `config.configs.${i}.actions`,
      });
    }
    if (s.config === undefined)
      throw new RefusalError('bad_config', 'each component entry needs its config', {
        field: `config.configs.${i}.config`,
      });
  }
}

// ---- input values ---------------------------------------------------------------------------

/** @throws HeraldError invalid_request when `action` is DELETE (use the DELETE route) */
export function checkRevisionAction(a: DeployAction | undefined): DeployAction | undefined {
  if (a === 'DELETE')
    throw new HeraldError(
      'invalid_request',
      'action DELETE: delete the deployment instead (DELETE /v1/deployments/{id})',
      { field: 'action' },
    );
  return a;
}

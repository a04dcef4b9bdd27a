#!/usr/bin/env node
// `npm run package`: the self-contained agent of docs/installing.md in dist/package/: one JavaScript file
// that runs with plain `node` (20 or newer) and needs no node_modules and no native module,
// beside the systemd unit and the cloud-init example. Bundled by esbuild from the TypeScript
// sources (cli/agent-main.ts and what it imports: the agent, protocol/, certs/ reading only).
import fs from 'node:fs';
import { builtinModules } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFileSync } from 'node:child_process';
import { build } from 'esbuild';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = path.join(root, 'dist', 'package');
fs.rmSync(out, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });
const file = path.join(out, 'herald-agent.mjs');
const version = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')).version;

/**
 * The agent require()s its CommonJS dependencies through `createRequire(import.meta.url)` (see
 * agent/listener.ts: it saves idle memory in the unbundled agent). esbuild cannot follow such a
 * call, so in the bundle it becomes a plain require() of the same package, which esbuild bundles.
 */
function requireLikeImport() {
  return {
    name: 'require-like-import',
    setup(b) {
      b.onLoad({ filter: /\.ts$/ }, async (args) => {
        const src = await fs.promises.readFile(args.path, 'utf8');
        return {
          contents: src.replace(/createRequire\(import\.meta\.url\)\(('[^']+')\)/g, 'require($1)'),
          loader: 'ts',
        };
      });
    },
  };
}

/**
 * ws's optional native accelerators (`bufferutil`, `utf-8-validate`) become a module that throws:
 * ws require()s each in a try/catch and takes its own JavaScript path. Left external, each was
 * looked up in every node_modules above the file and run, as root: code from outside the file.
 */
const ABSENT = ['bufferutil', 'utf-8-validate'];
function absentModules() {
  return {
    name: 'absent-modules',
    setup(b) {
      const filter = new RegExp(`^(${ABSENT.join('|')})$`);
      b.onResolve({ filter }, (a) => ({ path: a.path, namespace: 'herald-absent' }));
      b.onLoad({ filter: /.*/, namespace: 'herald-absent' }, (a) => ({
        contents: `throw new Error(${JSON.stringify(`${a.path} is not part of herald-agent`)});`,
        loader: 'js',
      }));
    },
  };
}

/**
 * The bundle may load Node's built-ins and nothing else (docs/installing.md): any other module
 * left external would be looked up in the node_modules directories above wherever the file is.
 */
function onlyBuiltins(result, what) {
  const builtin = new Set(builtinModules);
  const outside = Object.values(result.metafile.outputs)
    .flatMap((o) => o.imports)
    .filter((i) => i.external && !i.path.startsWith('node:') && !builtin.has(i.path))
    .map((i) => i.path);
  if (outside.length > 0) {
    console.error(`package: ${what} would load ${[...new Set(outside)].join(', ')} from outside itself`);
    process.exit(1);
  }
}

const r = await build({
  entryPoints: [path.join(root, 'cli', 'agent-main.ts')],
  outfile: file,
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node20',
  minify: false,
  legalComments: 'eof',
  metafile: true,
  // CommonJS dependencies (pino, ws, commander) call require(): give the ES module one
  banner: {
    js: `#!/usr/bin/env node\n// herald-agent ${version}: built by npm run package; runs with node 20 or newer, nothing else.\nimport { createRequire as __heraldRequire } from 'node:module';\nconst require = __heraldRequire(import.meta.url);`,
  },
  logLevel: 'warning',
  plugins: [absentModules(), requireLikeImport()],
});
onlyBuiltins(r, 'herald-agent.mjs');
const inputs = Object.keys(r.metafile.inputs);
const forbidden = inputs.filter((i) => /better-sqlite3|node-forge|sodium-native|controller\/|\.node$/.test(i));
if (forbidden.length > 0) {
  console.error(`package: the agent bundle must not carry ${forbidden.join(', ')}`);
  process.exit(1);
}
fs.chmodSync(file, 0o755);
for (const f of ['herald-agent.service', 'herald-agent.env', 'cloud-init.yaml']) {
  fs.copyFileSync(path.join(root, 'packaging', f), path.join(out, f));
}
const kb = Math.round(fs.statSync(file).size / 1024);
console.log(
  `package: ${path.relative(root, file)} (${kb} KiB, ${inputs.length} modules), herald-agent.service, herald-agent.env, cloud-init.yaml`,
);

// --sea: also a Node single-executable application (the node binary with the agent inside);
// Node 20 runs only a CommonJS main script in one, so the same entry is bundled again as CJS
if (process.argv.includes('--sea')) {
  const work = fs.mkdtempSync(path.join(out, '.sea-'));
  try {
    const cjs = path.join(work, 'herald-agent.cjs');
    const sea = await build({
      entryPoints: [path.join(root, 'cli', 'agent-main.ts')],
      outfile: cjs,
      bundle: true,
      platform: 'node',
      format: 'cjs',
      target: 'node20',
      metafile: true,
      logLevel: 'warning',
      plugins: [absentModules(), requireLikeImport()],
    });
    onlyBuiltins(sea, 'the single executable');
    const blob = path.join(work, 'sea-prep.blob');
    const config = path.join(work, 'sea-config.json');
    fs.writeFileSync(config, JSON.stringify({ main: cjs, output: blob, disableExperimentalSEAWarning: true }));
    execFileSync(process.execPath, ['--experimental-sea-config', config], { stdio: 'pipe' });
    const exe = path.join(out, 'herald-agent');
    fs.copyFileSync(process.execPath, exe);
    fs.chmodSync(exe, 0o755);
    const { inject } = await import('postject');
    await inject(exe, 'NODE_SEA_BLOB', fs.readFileSync(blob), {
      sentinelFuse: 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2',
    });
    const mb = (fs.statSync(exe).size / 1024 / 1024).toFixed(1);
    console.log(
      `package: ${path.relative(root, exe)} (single executable, ${mb} MiB: node ${process.version} itself plus the agent)`,
    );
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

/**
 * The demo's two SoftwareConfigs (group `script`): the install script starts a small
 * orchestrator-like service (a detached process whose pid is in `<node>/service.pid`); the
 * uninstall script stops it. Neither touches `<node>/volume` nor the application container.
 * Both append a line to `<node>/runs.log`, so the demo can show each node's order of steps.
 */

/** Shared by both: `alive <pid>` is false for a zombie (an orphan whose reaper is slow). */
const ALIVE_FN = `alive() {
  if [ -r "/proc/$1/stat" ]; then
    ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat"
  else
    kill -0 "$1" 2>/dev/null
  fi
}`;

export const INSTALL_SCRIPT = `#!/bin/sh
# install: start the demo's orchestrator-like service on this node
set -eu
dir="\${demo_root:?}/\${deploy_server_id:?}"
mkdir -p "$dir"
echo "install \${deploy_action:-?}" >> "$dir/runs.log"
pidfile="$dir/service.pid"
# the version the service runs (herald demo --upgrade rolls a new one: docs/api.md "Upgrades")
echo "\${service_version:-1}" > "$dir/version"
${ALIVE_FN}
# a few lines while it works, so the operator sees progress live (docs/api.md)
echo "install on \${deploy_server_id}: checking the node"
sleep 0.1
echo "install on \${deploy_server_id}: preparing the service"
sleep 0.1
if [ -s "$pidfile" ] && alive "$(cat "$pidfile")"; then
  echo "service already running: pid $(cat "$pidfile")"
else
  rm -f "$pidfile"
  # a daemon in its own session, its output away from the hook's pipes
  if command -v setsid >/dev/null 2>&1; then launch=setsid; else launch=nohup; fi
  $launch sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && exec sleep 86400' demo-service "$pidfile" </dev/null >/dev/null 2>&1 &
  i=0
  while [ ! -s "$pidfile" ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  [ -s "$pidfile" ] || { echo "the service did not start" >&2; exit 1; }
  echo "service started: pid $(cat "$pidfile")"
fi
cat "$pidfile" > "\${heat_outputs_path}.service_pid"
`;

export const UNINSTALL_SCRIPT = `#!/bin/sh
# uninstall: stop the service; the volume and the application container are left alone
set -eu
dir="\${demo_root:?}/\${deploy_server_id:?}"
mkdir -p "$dir"
echo "uninstall \${deploy_action:-?}" >> "$dir/runs.log"
pidfile="$dir/service.pid"
${ALIVE_FN}
if [ -s "$pidfile" ]; then
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  i=0
  while alive "$pid" && [ "$i" -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
  rm -f "$pidfile"
  echo "service stopped: pid $pid"
else
  echo "service was not running"
fi
`;

/** The health check run after each node's install (deploy_action CHECK): its service must run. */
export const HEALTH_SCRIPT = `#!/bin/sh
set -eu
dir="\${demo_root:?}/\${deploy_server_id:?}"
${ALIVE_FN}
pid=$(cat "$dir/service.pid" 2>/dev/null || true)
if [ -n "$pid" ] && alive "$pid"; then echo "healthy: service pid $pid"; else echo "unhealthy: no service" >&2; exit 1; fi
`;

/**
 * A release whose service dies at start (`herald demo --upgrade`): the install itself succeeds,
 * so only the health check after it catches the bad version.
 */
export const BROKEN_INSTALL_SCRIPT = `#!/bin/sh
set -eu
dir="\${demo_root:?}/\${deploy_server_id:?}"
mkdir -p "$dir"
echo "install \${deploy_action:-?}" >> "$dir/runs.log"
echo "\${service_version:-?}" > "$dir/version"
echo "install on \${deploy_server_id}: service version \${service_version:-?} installed"
echo "the service exited at start: bad configuration (version \${service_version:-?})"
`;

/** A failing install, for tests: exits 3 with a reason on stderr. */
export const FAILING_INSTALL_SCRIPT = `#!/bin/sh
echo "install failed on purpose on \${deploy_server_id:-?}" >&2
exit 3
`;

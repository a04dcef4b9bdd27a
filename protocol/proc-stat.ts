/**
 * One line of Linux's `/proc/<pid>/stat` (proc(5)), parsed. The agent (its hook groups and
 * running.json's start times), the demo, the benchmark and the tests all read processes this
 * way, so the one subtle rule lives here: the command name (field 2) is in parentheses and may
 * itself hold spaces and parentheses, so fields are counted from the LAST `)`.
 *
 * Pure: the caller reads the file (`fs.readFileSync(`/proc/${pid}/stat`, 'latin1')`).
 */

export type ProcStat = {
  pid: number;
  /** The command name, without its parentheses (at most 15 bytes, as the kernel keeps it). */
  comm: string;
  /** Field 3: R running, S sleeping, D disk wait, Z zombie, T stopped, X dead, ... */
  state: string;
  ppid: number;
  /** The process group id (field 5). */
  pgrp: number;
  /** Minor page faults so far (field 10): pages mapped without a disk read (fresh, or copied on write). */
  minorFaults: number;
  /** User and system CPU time, in clock ticks (fields 14 and 15; usually 100 a second). */
  utimeTicks: number;
  stimeTicks: number;
  /**
   * Start time after boot in clock ticks (field 22), kept as the kernel's text: with the pid it
   * names one process for good, so a recycled pid is never mistaken for the old one.
   */
  startTimeTicks: string;
};

/** The fields after the command name, from field 3 on (index 0); undefined when `text` is not a stat line. */
function fieldsAfterComm(text: string): { open: number; close: number; f: string[] } | undefined {
  const open = text.indexOf(' (');
  const close = text.lastIndexOf(')');
  if (open < 0 || close < open) return undefined;
  const f = text
    .slice(close + 2)
    .trimEnd()
    .split(' ');
  return f.length < 20 ? undefined : { open, close, f };
}

/** Parses the text of `/proc/<pid>/stat`; undefined when it is not one. */
export function parseProcStat(text: string): ProcStat | undefined {
  const at = fieldsAfterComm(text);
  if (at === undefined) return undefined;
  const { open, close, f } = at;
  const pid = Number(text.slice(0, open));
  const ppid = Number(f[1]);
  const pgrp = Number(f[2]);
  const minorFaults = Number(f[7]);
  const utimeTicks = Number(f[11]);
  const stimeTicks = Number(f[12]);
  if (![pid, ppid, pgrp, minorFaults, utimeTicks, stimeTicks].every(Number.isSafeInteger) || !/^\d+$/.test(f[19]!))
    return undefined;
  return {
    pid,
    comm: text.slice(open + 2, close),
    state: f[0]!,
    ppid,
    pgrp,
    minorFaults,
    utimeTicks,
    stimeTicks,
    startTimeTicks: f[19]!,
  };
}

/**
 * The CPU of a process's children it has waited for (fields 16 and 17, cutime + cstime), in clock
 * ticks; undefined when `text` is not a stat line.
 */
export function reapedChildrenTicks(text: string): number | undefined {
  const f = fieldsAfterComm(text)?.f;
  const t = f && Number(f[13]) + Number(f[14]);
  return t !== undefined && Number.isSafeInteger(t) ? t : undefined;
}

/** A state of a process that still runs: neither a zombie (`Z`) nor dead (`X`, `x`). */
export function isLiveState(state: string): boolean {
  return state !== 'Z' && state !== 'X' && state !== 'x';
}

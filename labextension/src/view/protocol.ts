/**
 * The `viceroy.mesh` protocol, shared by the comm (side panel, status bar) and the anywidget
 * `MeshView`. The kernel side lives in viceroy/extension/comm.py and widget.py.
 */

export type RankState =
  | 'starting'
  | 'idle'
  | 'running'
  | 'done'
  | 'error'
  | 'dead'
  | 'interrupted';

export const RANK_STATES: readonly RankState[] = [
  'starting',
  'idle',
  'running',
  'done',
  'error',
  'dead',
  'interrupted'
];

/** One rank, as the kernel reports it. */
export interface IRankRecord {
  rank: number;
  coords: Record<string, number>;
  host: string;
  state: RankState;
  call: number | null;
  label: string;
  /** Epoch seconds. */
  started: number | null;
  /** Seconds; null while running (the front end ticks it from `started`). */
  elapsed: number | null;
  /** Bytes. */
  rss: number | null;
  gpu_mem: number | null;
  gpu_util: number | null;
  last_line: string;
  pid: number | null;
  exit: string | null;
  /** One-line summary of the error. */
  error: string | null;
}

export interface ICallRecord {
  call: number;
  label: string;
  ranks: number[];
  started: number | null;
}

export interface ISummary {
  total: number;
  alive: number;
  running: number;
  /** Ranks not up yet (a kernel of an older Viceroy leaves it out: none). */
  starting?: number;
  failed: number;
}

/** A full snapshot. */
export interface IStateMessage {
  type: 'state';
  seq: number;
  dims: Record<string, number> | null;
  ranks: IRankRecord[];
  calls: ICallRecord[];
  auto: boolean;
  summary: ISummary;
}

/** Changed fields only, keyed by rank (as a string, JSON keys being strings). */
export interface IDiffMessage {
  type: 'diff';
  seq: number;
  ranks: Record<string, Partial<IRankRecord>>;
  calls?: ICallRecord[];
  auto?: boolean;
  summary?: ISummary;
}

export interface ILogsMessage {
  type: 'logs';
  rank: number;
  text: string;
}

export interface ITracebackMessage {
  type: 'traceback';
  rank: number;
  text: string;
}

export interface IStacksMessage {
  type: 'stacks';
  stacks: Record<string, string>;
}

export interface IInterruptedMessage {
  type: 'interrupted';
  ranks: number[];
}

export interface IRestartedMessage {
  type: 'restarted';
  ranks: number[];
}

export interface IErrorMessage {
  type: 'error';
  request: string | null;
  message: string;
}

export type ReplyMessage =
  | ILogsMessage
  | ITracebackMessage
  | IStacksMessage
  | IInterruptedMessage
  | IRestartedMessage
  | IErrorMessage;

export type KernelMessage = IStateMessage | IDiffMessage | ReplyMessage;

export type RequestKind =
  | 'snapshot'
  | 'logs'
  | 'traceback'
  | 'stacks'
  | 'interrupt'
  | 'restart_failed'
  | 'alive';

/** Front end to kernel. */
export interface IRequest {
  request: RequestKind;
  rank?: number;
  tail?: number;
}

/** Whatever carries requests to the kernel (a comm, an anywidget model). */
export type SendRequest = (request: IRequest) => void;

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

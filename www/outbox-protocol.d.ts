/**
 * The messages of sw-outbox's behaviour contract, as TypeScript types: the configuration
 * a site's worker script passes (`self.SW_OUTBOX_CONFIG`), the commands a page sends, the
 * worker's answers (COMMAND_RESULT, QUEUE_STATE), the reports it broadcasts, and the
 * worker's own HTTP answers.
 *
 * Written by hand because no JavaScript implements them: the worker that speaks them is
 * Rust. The page helper's types are generated from the JSDoc of `outbox-client.js`,
 * which imports these; `tests/types/` checks both, and checks the names here (commands,
 * reports, reasons, configuration fields) against the Rust source.
 *
 * Field names and strings are the contract's (docs/PROTOCOL.md).
 */

// ---------------------------------------------------------------- configuration

/** `self.SW_OUTBOX_CONFIG`: every field is optional and has the contract's default. */
export interface OutboxConfig {
  /** Same-origin paths starting with this are the outbox's business. Default `/api/`. */
  apiPrefix?: string;
  /** JavaScript RegExp source, case-insensitive, on path + query. Default (r4): the usual
   * sign-in, sign-out and token routes (`auth`, `login`, `logout`, `signin`, `signout`,
   * `sign-in`, `sign-out`, `session(s)`, `token(s)`, `refresh`, `oauth`) as the first path
   * segment, or the second after `/api/` or `/accounts/`. Outside `apiPrefix` only observed. */
  authRoutePattern?: string;
  /** Identity endpoint asked before every replay. Default `/api/auth/me`. */
  authMePath?: string;
  /** Default `X-PM-Expected-Account`. */
  expectedAccountHeader?: string;
  /** Default `X-CSRF-Token`. */
  csrfHeader?: string;
  /** JavaScript RegExp source on the record path; group 1 is the workspace. Default `^/projects/([^/?#]+)`. */
  workspacePattern?: string;
  /** IndexedDB database name. Default: `sw-outbox` for the origin's first registration,
   * `sw-outbox:<scope path>` for another scope's; set it (the same) in every
   * registration that is to share one database. */
  dbName?: string | null;
  /** Background Sync tag. Default `sw-outbox`. */
  syncTag?: string;
  /** Default 15000. */
  attemptTimeoutMs?: number;
  /** Default 1048576 (1 MiB). */
  maxBodyBytes?: number;
  /** Default 10000. */
  maxRecords?: number;
  /** Default 3. */
  maxServerFailures?: number;
  /** How long 409 "still running" answers in a row are waited for before a write needs
   * attention (`conflict`, with `maxServerFailures` such answers too): a slow server's
   * first attempt is waited for. 0 – 2^53 − 1; default 600000 (10 min). */
  stillRunningPatienceMs?: number;
  /** Default 604800000 (7 days). */
  maxRetentionMs?: number;
  /** Default 25000. */
  flushBudgetMs?: number;
  /** 1–32, default 4. */
  replayConcurrency?: number;
  /** App-shell URLs cached at install; relative ones resolve against the worker script. Default `[]`. */
  precache?: string[];
  /** The precached URL answered for failed navigations. Default: the first page in `precache`. */
  shellUrl?: string;
  /** Where a click on a delivery notification opens the app. Default `/`. */
  notificationUrl?: string;
  /** Whether a new version takes over as soon as it installed. `false`: it waits until a
   * page posts it `{type: 'SKIP_WAITING'}` (the page helper's `applyUpdate()`), for a
   * prompt-to-update flow. Default true. */
  skipWaiting?: boolean;
  /** (r4) Whether the worker serves only the API: where the browser offers static routing
   * (`InstallEvent.addRoutes`, Chromium), the install routes every request that is neither
   * under `apiPrefix` nor an auth route (nor, with `precache`, a navigation or a precached
   * file) to the network, so page loads never reach its fetch listeners. Default false: every
   * request reaches the worker's fetch listeners (your own caching included). */
  staticRoutes?: boolean;
  /** Set by `sw.js` from `pkg/build.js` and `SW_OUTBOX_SHELL_BUILD`; names the cache
   * `sw-outbox-<build>`. A value set here is overwritten. */
  build?: string;
  /** A JavaScript RegExp source; matching writes are sent but never queued (503 queued:false offline). Default none. */
  neverQueuePattern?: string | null;
  /** How long the server's idempotency ledger keeps a key; must not exceed it. Default 86400000 (24 h). */
  serverKeyTtlMs?: number;
  /** The longest a server's Retry-After may hold delivery. Default 3600000 (1 h). */
  maxRetryAfterMs?: number;
  /** After a network failure, how often the worker probes the network while it queues writes without an attempt. Default 2000. */
  offlineProbeMs?: number;
  /** The page's headers stored with a record and sent on its replays (never Cookie, Authorization, the CSRF header, hop-by-hop headers). */
  replayHeaders?: string[];
  /** Statuses (400–599) that queue a first attempt like a network failure (202), unless the
   * answer carries `Idempotent-Replayed: true`. Default `[502, 503, 504]`; `[]`: every
   * answer passes through. */
  queueStatuses?: number[];
  /** Whether AUTH_SESSION's `authorization` is kept in IndexedDB across worker restarts.
   * Default false: in memory only, and a restarted worker asks for it (AUTH_NEEDED)
   * before it replays. */
  persistAuthorization?: boolean;
}

declare global {
  /** Read by `sw.js` when it runs: the site's configuration. */
  // eslint-disable-next-line no-var
  var SW_OUTBOX_CONFIG: OutboxConfig | undefined;
  /** Read by `sw.js`: the URL of the directory holding `sw.js` and `pkg/`. */
  // eslint-disable-next-line no-var
  var SW_OUTBOX_BASE: string | undefined;
  /** Read by `sw.js`: the site's own build id (e.g. a hash of its shell). The cache is
   * then named `sw-outbox-<outbox build>-<this>`, so a new shell gets a new cache.
   * Letters, digits, `.`, `_` and `-` only. */
  // eslint-disable-next-line no-var
  var SW_OUTBOX_SHELL_BUILD: string | undefined;
}

// ---------------------------------------------------------------- shared shapes

/** A record id: a positive safe integer. */
export type RecordId = number;

/** A `requestId` a page may add to any command; echoed back unchanged. */
export type RequestId = string | number;

/** Why a record is needs-attention. */
export type AttentionReason =
  | 'outcome-unknown'
  | 'key-reused'
  | 'repeated-5xx'
  | 'rejected'
  | 'expired'
  | 'redirected'
  | 'conflict'
  | 'key-expired';

/** Why a record was not sent (MUTATIONS_BLOCKED), first that applies. */
export type BlockReason =
  | 'corrupt-record'
  | 'auth-route'
  | 'no-session'
  | 'unknown-owner'
  | 'owner-mismatch'
  | AttentionReason
  | 'workspace-order';

export type WriteMethod = 'POST' | 'PUT' | 'PATCH' | 'DELETE';

// ---------------------------------------------------------------- commands (page → worker)

interface CommandBase {
  requestId?: RequestId;
}

/** Persist the signed-in account (null: signed out). */
export interface AuthSessionCommand extends CommandBase {
  type: 'AUTH_SESSION';
  userId: string | null;
  /** An app that authenticates with a token: the `Authorization` header value
   * (`'Bearer …'`) its identity checks and this account's replays carry. Held for the
   * session (never stored with a write), replaced by the next AUTH_SESSION, deleted by a
   * sign-out and CLEAR_DEVICE; kept across worker restarts only with
   * `persistAuthorization`. Only with a userId. */
  authorization?: string | null;
}

/** Run a flush; answered after it with `affected` = records replayed. */
export interface FlushQueueCommand extends CommandBase {
  type: 'FLUSH_QUEUE';
}

/** Adopt unknown-owner records (all, or those ids) for `ownerId`, verified with the server. */
export interface RebindRecordsCommand extends CommandBase {
  type: 'REBIND_RECORDS';
  ownerId: string;
  ids?: RecordId[];
}

/** Retry a needs-attention record under a fresh key, or discard it (a corrupt one too),
 * or edit a queued or needs-attention one (new body, fresh key, same place). */
export type RecoverRecordCommand = CommandBase & {
  type: 'RECOVER_RECORD';
  id: RecordId;
  ownerId: string;
} & (
  | { action: 'retry-new' | 'discard' }
  | {
      action: 'edit';
      /** The new body: text, or base64 with `bodyEncoding: 'base64'`; at most maxBodyBytes. */
      body: string;
      bodyEncoding?: 'text' | 'base64';
      /** Omitted: the record keeps its Content-Type. */
      contentType?: string;
    }
);

/** The owner's record with its body, after the identity check; answered with RECORD. */
export interface ReadRecordCommand extends CommandBase {
  type: 'READ_RECORD';
  id: RecordId;
  ownerId: string;
}

/** Every record's metadata; answered with QUEUE_STATE. */
export interface ListQueueCommand extends CommandBase {
  type: 'LIST_QUEUE';
}

/** Delete every record and the session. */
export interface ClearDeviceCommand extends CommandBase {
  type: 'CLEAR_DEVICE';
}

/** Opt the signed-in account in or out of delivery notifications (an addition). */
export interface SetNotificationsCommand extends CommandBase {
  type: 'SET_NOTIFICATIONS';
  userId: string;
  enabled: boolean;
}

/** Abort the first attempt of the write with this key while it is not yet stored (contract 2.8). */
export interface AbortWriteCommand extends CommandBase {
  type: 'ABORT_WRITE';
  idempotencyKey: string;
}

export type Command =
  | ReadRecordCommand
  | AbortWriteCommand
  | AuthSessionCommand
  | FlushQueueCommand
  | RebindRecordsCommand
  | RecoverRecordCommand
  | ListQueueCommand
  | ClearDeviceCommand
  | SetNotificationsCommand;

export type CommandType = Command['type'];

// ---------------------------------------------------------------- answers (worker → the sender)

/** The answer to every command but LIST_QUEUE. */
export interface CommandResult {
  type: 'COMMAND_RESULT';
  /** The command's `type` as sent; null when the message had none (or not a string). */
  command: CommandType | string | null;
  ok: boolean;
  /** Why it was refused (names the field for malformed messages). */
  reason?: string;
  /** Records replayed (FLUSH_QUEUE), adopted (REBIND_RECORDS), changed or deleted. */
  affected?: number;
  requestId?: RequestId;
}

/** One record of QUEUE_STATE: metadata, never the body. Corrupt records have nulls. */
export interface QueueRecord {
  id: RecordId;
  method: WriteMethod | null;
  /** Relative to the API base (`/api`), query included. */
  path: string | null;
  ownerId: string | null;
  workspace: string | null;
  state: 'queued' | 'needs-attention' | 'corrupt';
  attentionReason: AttentionReason | null;
  /** The HTTP status that made it needs-attention (`rejected`), else null. */
  lastStatus: number | null;
  /** When it was queued (ms since the epoch). */
  timestamp: number | null;
  bodySize: number | null;
}

/** Why a flush stopped before the queue was drained. */
export type StopReason =
  | 'offline'
  | 'signed-out'
  | 'identity-check'
  | 'unauthorized'
  | 'rate-limited'
  | 'account-mismatch'
  | 'budget'
  | 'storage';

/** How delivery stands, as the last flush left it (survives a worker restart). */
export interface Delivery {
  /** Why the last flush stopped; null when it did not (or the queue is empty). */
  stoppedBy: StopReason | null;
  /** When the worker tries again on its own (ms since the epoch); null when it waits for
   * a trigger (a sign-in, a page's flush) or has nothing it can try. */
  retryAt: number | null;
  /** When the last flush ran (ms since the epoch); null when none has. */
  lastAttemptAt: number | null;
}

/** The answer to LIST_QUEUE. */
export interface QueueState {
  type: 'QUEUE_STATE';
  records: QueueRecord[];
  delivery: Delivery;
  /**
   * The account of the session the worker holds: the last `AUTH_SESSION`'s `userId`, as
   * persisted (null: signed out, or none yet). A page reloaded offline, which cannot ask
   * the server who is signed in, learns from it whose writes are pending.
   */
  account: string | null;
  requestId?: RequestId;
}

/** The answer to READ_RECORD. */
export interface RecordAnswer {
  type: 'RECORD';
  record: {
    id: RecordId;
    method: WriteMethod;
    /** Relative to the API base (`/api`), query included. */
    path: string;
    workspace: string | null;
    state: 'queued' | 'needs-attention';
    attentionReason: AttentionReason | null;
    lastStatus: number | null;
    contentType: string | null;
    /** `text` when the Content-Type is textual and the bytes are UTF-8, else `base64`. */
    bodyEncoding: 'text' | 'base64';
    /** Empty when the record has no body. */
    body: string;
    /** Sent at least once: it may already have been applied, so an edit or a retry under
     * a new key could apply it a second time. */
    sentBefore: boolean;
    timestamp: number;
  };
  requestId?: RequestId;
}

export type Answer = CommandResult | QueueState | RecordAnswer;

// ---------------------------------------------------------------- reports (worker → every window)

/** Another account's records have null method, path and workspace (privacy, contract 5). */
export interface BlockedRecord {
  id: RecordId;
  method: WriteMethod | null;
  path: string | null;
  ownerId: string | null;
  workspace: string | null;
  state: 'queued' | 'needs-attention' | 'corrupt';
  reason: BlockReason;
}

/** After every flush that passed the identity check, an empty list included. */
export interface MutationsBlocked {
  type: 'MUTATIONS_BLOCKED';
  blocked: BlockedRecord[];
}

/** After a flush, when the queue re-read afterwards is empty. */
export interface MutationsReplayed {
  type: 'MUTATIONS_REPLAYED';
  count: number;
}

/** After a flush, when records remain (or the queue could not be re-read); also after a
 * flush that stopped at the identity check (then with no MUTATIONS_BLOCKED before it). */
export interface MutationsPartial {
  type: 'MUTATIONS_PARTIAL';
  replayed: number;
  remaining: number;
  /** Why the flush stopped; null when it was not stopped (what remains waits for a
   * person, or was left to be tried again). */
  stoppedBy: StopReason | null;
  /** When the worker tries again on its own; null when it waits for a trigger. */
  retryAt: number | null;
}

/** When a write was queued (after its transaction committed). */
export interface MutationQueued {
  type: 'MUTATION_QUEUED';
  id: RecordId;
  method: WriteMethod;
  path: string;
  workspace: string | null;
  ownerId: string | null;
  /** Whether it can be delivered while no page of the site is open (Background Sync was
   * registered for it); false: "will be sent next time you open the app". */
  background: boolean;
}

/** A replayed write the server answered 2xx; sent to the windows of its account only. */
export interface MutationSettled {
  type: 'MUTATION_SETTLED';
  id: RecordId;
  idempotencyKey: string;
  ownerId: string | null;
  /** The server's status (a ledger's stored one when it replayed only the status). */
  status: number;
  /** With `body`: the answer's Content-Type. */
  contentType?: string;
  /** The answer's text (the created entity, its server id) when it is text or JSON of
   * at most 64 KiB read within the attempt's timeout; absent otherwise. */
  body?: string;
}

/** The server refused the credential of `userId`'s session (a 401 to it), or a restarted
 * worker does not hold it: send AUTH_SESSION with a fresh `authorization` (the page
 * helper's `getAuthorization` option does), and delivery resumes. */
export interface AuthNeeded {
  type: 'AUTH_NEEDED';
  userId: string;
}

/** A delivery notification was clicked while a window of the app was open: show this record (the app's recovery view). */
export interface ShowRecord {
  type: 'SHOW_RECORD';
  id: RecordId;
}

export type Report =
  | MutationsBlocked
  | MutationsReplayed
  | MutationsPartial
  | MutationQueued
  | MutationSettled
  | AuthNeeded
  | ShowRecord;
export type ReportType = Report['type'];

/** Anything the worker posts to a page. */
export type WorkerMessage = Report | Answer;

// ---------------------------------------------------------------- the worker's own HTTP answers

/** 202: the write is stored durably and will be replayed. */
export interface QueuedResponseBody {
  queued: true;
  id: RecordId;
  idempotencyKey: string;
  message: string;
  /** Whether it can be delivered while no page of the site is open (Background Sync). */
  background: boolean;
}

/** 503 (storage failure), 413 (body over maxBodyBytes), 507 (queue full), 400 (bad page key). */
export interface NotQueuedResponseBody {
  queued: false;
  error: string;
}

/** 503 for an API read or auth route whose network failed. */
export interface OfflineResponseBody {
  error: 'offline';
}

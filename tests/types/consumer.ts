// A consumer of every export of `sw-outbox` and `sw-outbox/vite`, checked with
// `tsc --noEmit --strict` against the installed tarball (tests/types/types.test.mjs).
// It is never run. Each `@ts-expect-error` is a use the declarations must refuse: if a
// type went loose (e.g. to `any`), that line would compile and tsc would fail on the
// unused directive.
import {
  REPORT_TYPES, OutboxClient, registerOutbox,
  type AbortWriteCommand, type Answer, type ReadRecordCommand, type RecordAnswer, type ShowRecord, type AttentionReason, type AuthSessionCommand, type BlockReason,
  type BlockedRecord, type ClearDeviceCommand, type Command, type CommandResult,
  type CommandType, type FlushQueueCommand, type ListQueueCommand, type MutationQueued,
  type MutationsBlocked, type MutationsPartial, type MutationsReplayed,
  type NotQueuedResponseBody, type OfflineResponseBody, type OutboxConfig,
  type QueueRecord, type QueueState, type QueuedResponseBody, type RebindRecordsCommand,
  type RecordId, type RecoverRecordCommand, type Report, type ReportType, type RequestId,
  type SetNotificationsCommand, type WorkerMessage, type WriteMethod, type StopReason, type Delivery,
  type MutationSettled, type AuthNeeded, type AuthorizationProvider,
  OutboxStore, INITIAL_STATE, SETTLED_KEPT, WriteNotSettledError,
  type OutboxState, type OutboxListener, type SettledWrite,
} from 'sw-outbox';
import swOutbox, { type SwOutboxOptions } from 'sw-outbox/vite';
import { useOutbox } from 'sw-outbox/react';
import type { Plugin } from 'vite';

// ---------------------------------------------------------------- configuration

const config: OutboxConfig = {
  apiPrefix: '/api/',
  authRoutePattern: '^/api/auth(/|\\?|$)',
  authMePath: '/api/auth/me',
  expectedAccountHeader: 'X-PM-Expected-Account',
  csrfHeader: 'X-CSRF-Token',
  workspacePattern: '^/projects/([^/?#]+)',
  dbName: 'my-outbox',
  syncTag: 'my-outbox',
  attemptTimeoutMs: 15000,
  maxBodyBytes: 1048576,
  maxRecords: 10000,
  maxServerFailures: 3,
  maxRetentionMs: 604800000,
  flushBudgetMs: 25000,
  replayConcurrency: 4,
  precache: ['./', './index.html'],
  shellUrl: './index.html',
  notificationUrl: '/',
  skipWaiting: false,
  staticRoutes: true,
  build: 'ignored',
  queueStatuses: [502, 503, 504],
  persistAuthorization: false,
};
// @ts-expect-error a timer is a number of milliseconds
const badConfig: OutboxConfig = { attemptTimeoutMs: '15s' };
// @ts-expect-error skipWaiting is a boolean, not a word
const badSkip: OutboxConfig = { skipWaiting: 'no' };
// @ts-expect-error staticRoutes is a boolean, not a word
const badStatic: OutboxConfig = { staticRoutes: 'yes' };
// @ts-expect-error unknown fields are refused (the worker refuses them too)
const typoConfig: OutboxConfig = { apiPrefx: '/api/' };

// A site's own worker script (typed here in a window program through globalThis).
globalThis.SW_OUTBOX_CONFIG = config;
globalThis.SW_OUTBOX_BASE = '/sw-outbox/';
globalThis.SW_OUTBOX_SHELL_BUILD = 'a1b2c3';

// ---------------------------------------------------------------- the Vite plugin

const options: SwOutboxOptions = {
  config: { apiPrefix: '/api/', dbName: 'my-outbox' },
  precache: (files) => files.filter((f) => !f.endsWith('.png')),
  shellBuild: 'deploy-42',
  swFileName: 'sw.js',
  dir: 'sw-outbox',
};
const plugins: Plugin[] = [swOutbox(options), swOutbox(), swOutbox({ precache: [] }), swOutbox({ precache: 'bundle' })];
// @ts-expect-error the shell is the plugin's `precache` option, not a config field
swOutbox({ config: { precache: ['./'] } });
// @ts-expect-error precache is 'bundle', a list or a function
swOutbox({ precache: 'everything' });

// ---------------------------------------------------------------- the page helper

const reportTypes: readonly ReportType[] = REPORT_TYPES;

async function adopter(): Promise<void> {
  const getAuthorization: AuthorizationProvider = async (userId: string) => `Bearer token-of-${userId}`;
  const outbox: OutboxClient = await registerOutbox({
    scriptUrl: '/sw.js', scope: '/', timeoutMs: 10000, commandTimeoutMs: 60000, persist: 'first-queued', getAuthorization,
  });
  await registerOutbox({ persist: 'now' });
  // @ts-expect-error persist is 'never', 'first-queued' or 'now'
  await registerOutbox({ persist: true });
  // @ts-expect-error a provider resolves with a header value, not a token object
  await registerOutbox({ getAuthorization: async () => ({ accessToken: 'x' }) });
  const registration: ServiceWorkerRegistration | undefined = outbox.registration;
  const registered: ServiceWorkerRegistration | undefined = await outbox.registered;
  await outbox.controlled;
  const persisted: boolean | undefined = await outbox.persisted;
  const granted: boolean = await outbox.persist();
  // The update lifecycle, for a prompt-to-update flow (`skipWaiting: false`).
  const offWaiting = outbox.onUpdateWaiting((worker: ServiceWorker) => worker.scriptURL);
  const offControlling = outbox.onControlling(({ isUpdate }) => { if (isUpdate) location.reload(); });
  offWaiting();
  offControlling();
  const waiting: ServiceWorker | null = outbox.waiting;
  const applied: boolean = await outbox.applyUpdate({ timeoutMs: 5000 });
  await outbox.update();
  const timeout: number = outbox.commandTimeoutMs;
  // @ts-expect-error internals are private
  outbox.pending.clear();

  const offBlocked = outbox.on('MUTATIONS_BLOCKED', (m: MutationsBlocked) => {
    const first: BlockedRecord | undefined = m.blocked[0];
    const reason: BlockReason | undefined = first?.reason;
    const method: WriteMethod | null | undefined = first?.method;
    void [reason, method];
  });
  outbox.on('MUTATIONS_REPLAYED', (m: MutationsReplayed) => m.count);
  outbox.on('MUTATIONS_PARTIAL', (m: MutationsPartial) => m.replayed + m.remaining);
  outbox.on('MUTATIONS_PARTIAL', (m: MutationsPartial) => {
    const why: StopReason | null = m.stoppedBy;
    const at: number | null = m.retryAt;
    void [why, at];
  });
  // @ts-expect-error not a stop reason of the contract
  const notAStop: StopReason = 'network';
  void notAStop;
  outbox.on('MUTATION_QUEUED', (m: MutationQueued) => m.path);
  outbox.on('MUTATION_QUEUED', (m: MutationQueued) => (m.background ? 'sent in the background' : 'sent next time'));
  outbox.on('MUTATION_SETTLED', (m: MutationSettled) => {
    const created: unknown = m.body !== undefined && m.contentType?.includes('json') ? JSON.parse(m.body) : null;
    const status: number = m.status;
    const key: string = m.idempotencyKey;
    void [created, status, key];
  });
  outbox.on('AUTH_NEEDED', (m: AuthNeeded) => m.userId);
  outbox.on('SHOW_RECORD', (m: ShowRecord) => m.id);
  // @ts-expect-error MUTATIONS_REPLAYED carries a count, not a list
  outbox.on('MUTATIONS_REPLAYED', (m) => m.blocked);
  // @ts-expect-error not a report type
  outbox.on('MUTATION_SENT', () => {});
  const all = (m: WorkerMessage) => {
    if (m.type === 'COMMAND_RESULT') return m.ok;
    if (m.type === 'QUEUE_STATE') return m.records.length;
    if (m.type === 'RECORD') return m.record.bodyEncoding;
    const report: Report = m;
    return report.type;
  };
  const offAll = outbox.on('*', all);
  offBlocked();
  offAll();
  outbox.off('*', all);

  const session: CommandResult = await outbox.authSession(null);
  const signed: CommandResult = await outbox.signedIn('alice');
  const bearerSigned: CommandResult = await outbox.signedIn('alice', 'Bearer abc');
  await outbox.authSession('alice', 'Bearer abc');
  // @ts-expect-error the credential is a header value (a string)
  await outbox.authSession('alice', { token: 'abc' });
  const flushed: CommandResult = await outbox.flush();
  const affected: number | undefined = flushed.affected;
  const state: QueueState = await outbox.list();
  const delivery: Delivery = state.delivery;
  const stalled: boolean = delivery.stoppedBy !== null && delivery.retryAt === null;
  const lastAttempt: number | null = delivery.lastAttemptAt;
  void [stalled, lastAttempt];
  const record: QueueRecord | undefined = state.records[0];
  const attention: AttentionReason | null | undefined = record?.attentionReason;
  const id: RecordId = record?.id ?? 1;
  await outbox.adopt('alice');
  await outbox.adopt('alice', [id]);
  await outbox.retry(id, 'alice');
  await outbox.discard(id, 'alice');
  // @ts-expect-error record ids are numbers
  await outbox.retry('7', 'alice');
  await outbox.clearDevice();
  await outbox.enableNotifications('alice');
  await outbox.disableNotifications('alice');
  // A write whose page abort reaches the worker (ABORT_WRITE), and the command itself.
  const written: Response = await outbox.fetch('/api/notes', {
    method: 'POST', body: '{}', signal: AbortSignal.timeout(8000),
  });
  const aborted: CommandResult = await outbox.abortWrite('order_1234');
  // A stuck write: read it, then resend it edited (or a refusal).
  const read: RecordAnswer | CommandResult = await outbox.read(id, 'alice');
  const readCommand: ReadRecordCommand = { type: 'READ_RECORD', id, ownerId: 'alice' };
  const edited: CommandResult = await outbox.edit(id, 'alice', '{"title":"shorter"}', { contentType: 'application/json' });
  // @ts-expect-error an edit carries its body
  const noBody: Command = { type: 'RECOVER_RECORD', id, ownerId: 'alice', action: 'edit' };

  // send(): typed by the command.
  const requestId: RequestId = 'r-1';
  const listed: QueueState = await outbox.send({ type: 'LIST_QUEUE', requestId } satisfies ListQueueCommand);
  const commands: Command[] = [
    { type: 'AUTH_SESSION', userId: 'alice' } satisfies AuthSessionCommand,
    { type: 'AUTH_SESSION', userId: 'alice', authorization: 'Bearer abc' } satisfies AuthSessionCommand,
    { type: 'FLUSH_QUEUE' } satisfies FlushQueueCommand,
    { type: 'REBIND_RECORDS', ownerId: 'alice', ids: [1] } satisfies RebindRecordsCommand,
    { type: 'RECOVER_RECORD', id: 1, ownerId: 'alice', action: 'retry-new' } satisfies RecoverRecordCommand,
    { type: 'CLEAR_DEVICE' } satisfies ClearDeviceCommand,
    { type: 'SET_NOTIFICATIONS', userId: 'alice', enabled: true } satisfies SetNotificationsCommand,
    { type: 'ABORT_WRITE', idempotencyKey: 'k:7f3e' } satisfies AbortWriteCommand,
  ];
  // @ts-expect-error RECOVER_RECORD's action is retry-new or discard
  const badCommand: Command = { type: 'RECOVER_RECORD', id: 1, ownerId: 'alice', action: 'retry' };
  const answered: CommandResult = await outbox.send({ type: 'FLUSH_QUEUE' });
  const future: Answer = await outbox.send({ type: 'SOMETHING_NEW', field: 1 }, { timeoutMs: 1000 });
  const names: CommandType[] = commands.map((c) => c.type);

  // The outbox's state for a UI: one frozen snapshot per change, and its subscription.
  const now: OutboxState = outbox.state;
  const waitingCount: number = now.pending.length;
  const reasons: BlockReason[] = now.blocked.map((b) => b.reason);
  const retryAt: number | null = now.delivery.retryAt;
  const canSendInBackground: boolean | null = now.background;
  const lastSettled: SettledWrite | undefined = now.settled.at(-1);
  const settledAt: number | undefined = lastSettled?.settledAt;
  const ready: boolean = now.ready;
  const account: string | null = now.account;
  // @ts-expect-error the state is read-only: a new snapshot per change, never edited
  now.pending.push(now.records[0]);
  const listener: OutboxListener = (s: OutboxState) => { void s.records; };
  const unsubscribe: () => void = outbox.subscribe(listener);
  unsubscribe();
  const { subscribe } = outbox; // bound: passed on as it is
  subscribe(() => {});
  const settledWrite: SettledWrite = await outbox.settlement(1);
  // @ts-expect-error a settlement is asked by record id (the 202's id), not by key
  await outbox.settlement('k:7f3e');
  try { await outbox.settlement(2); } catch (err) { if (err instanceof WriteNotSettledError) void err.id; }
  const initial: OutboxState = INITIAL_STATE;
  const kept: number = SETTLED_KEPT;
  const store = new OutboxStore({ relist: () => {}, now: () => 0 });
  store.onMessage({ type: 'MUTATIONS_REPLAYED', count: 0 });
  store.onAnswer({ type: 'LIST_QUEUE' }, { type: 'QUEUE_STATE', records: [], delivery: now.delivery, account: null }, store.mark());
  // The worker's session, named in the queue's answer (an offline reload knows whose writes wait).
  const workerAccount: string | null = state.account;
  const accountFrom: 'page' | 'worker' | null = now.accountFrom;
  void [workerAccount, accountFrom];
  store.backgroundAvailable(false);
  const fromStore: OutboxState = store.state;
  // React: the hook over the same store (null while the client is not made yet).
  const inComponent: OutboxState = useOutbox(outbox);
  const beforeClient: OutboxState = useOutbox(null);
  // @ts-expect-error the hook takes the page helper's client, not its state
  useOutbox(now);
  // With a selector: what it picks, typed by it (and an equality for built values).
  const pendingCount: number = useOutbox(outbox, (s) => s.pending.length);
  const stoppedBy: StopReason | null = useOutbox(null, (s) => s.delivery.stoppedBy);
  const ids: RecordId[] = useOutbox(outbox, (s) => s.pending.map((r) => r.id),
    (a, b) => a.length === b.length && a.every((x, i) => x === b[i]));
  // @ts-expect-error the selection is typed by the selector: a count is no string
  const wrongPick: string = useOutbox(outbox, (s) => s.pending.length);
  // @ts-expect-error the equality compares two selections
  useOutbox(outbox, (s) => s.pending.length, (a: string, b: string) => a === b);
  void [pendingCount, stoppedBy, ids, wrongPick];
  void [waitingCount, reasons, retryAt, canSendInBackground, settledAt, ready, account, settledWrite, initial, kept,
    fromStore, inComponent, beforeClient];

  // A client made by hand (tests do), attached and detached.
  const manual = new OutboxClient({ commandTimeoutMs: 5000 });
  manual.attach();
  manual.detach();

  // The worker's own HTTP answers, read from a write's response.
  const response = await fetch('/api/projects/p1/tasks', { method: 'POST', body: '{}' });
  if (response.status === 202) {
    const queued: QueuedResponseBody = await response.json();
    const key: string = queued.idempotencyKey;
    const background: boolean = queued.background;
    void [key, background];
  } else if (response.status === 503) {
    const body: NotQueuedResponseBody | OfflineResponseBody = await response.json();
    void body;
  }

  void [registration, registered, persisted, granted, waiting, applied, timeout, session, signed, bearerSigned, affected, attention, listed,
    answered, future, names, badCommand, written, aborted, read, readCommand, edited, noBody];
}

void [badConfig, badSkip, badStatic, typoConfig, plugins, reportTypes, adopter];

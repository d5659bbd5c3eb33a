// What the READMEs' page code leaves to the reader: the app's own names, typed as an app
// would have them. The page helper's types come from the installed tarball.
import type {
  BlockedRecord, OutboxClient, OutboxState, QueueRecord, QueuedResponseBody,
} from 'sw-outbox';

declare global {
  /** The signed-in person, as the app knows them. */
  const user: { id: string };
  /** A write the app shows (from `outbox.state` or `list()`). */
  const record: QueueRecord;
  /** A 202's body. */
  const queued: QueuedResponseBody;
  /** A write's body, and a corrected one. */
  const body: string;
  const fixedBody: string;
  /** A bearer app's token. */
  const accessToken: string;
  /** The client, where a block does not make its own. */
  const outbox: OutboxClient;
  function render(state: OutboxState): void;
  function renderRecoveryList(blocked: readonly BlockedRecord[]): void;
  function toast(text: string): void;
  function replaceOptimistic(idempotencyKey: string, entity: unknown): void;
  function showBanner(text: string, apply: () => Promise<void>): void;
  function refreshMyToken(userId: string): Promise<{ accessToken: string } | null>;
}

export {};

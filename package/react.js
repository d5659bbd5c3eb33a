/**
 * sw-outbox/react — the outbox's state in a React component.
 *
 * `useOutbox(outbox)` re-renders its component whenever the outbox's state changes
 * (`outbox.state`, kept current from the worker's reports; see the page helper), through
 * React's `useSyncExternalStore`, so every component reads one consistent snapshot.
 * React (18 or later) is an optional peer dependency of the package: only this entry
 * needs it.
 *
 * @example
 *   import { registerOutbox } from 'sw-outbox';
 *   import { useOutbox } from 'sw-outbox/react';
 *   const outbox = await registerOutbox();
 *   function PendingBadge() {
 *     const { pending, delivery } = useOutbox(outbox);
 *     return pending.length ? `${pending.length} waiting (${delivery.stoppedBy ?? 'sending'})` : null;
 *   }
 */
import { useSyncExternalStore } from 'react';
import { INITIAL_STATE } from './outbox-client.js';

/**
 * @import { OutboxClient, OutboxState } from './outbox-client.js'
 */

/** For a component rendered before the client exists: nothing changes. */
const noSubscription = () => () => {};
const initial = () => INITIAL_STATE;

/**
 * The outbox's state, re-rendering the component on every change.
 * @param {OutboxClient | null | undefined} outbox the page helper's client
 *   (`registerOutbox()`'s); null or undefined while it is not made yet: the initial
 *   state (`ready: false`, empty lists)
 * @returns {OutboxState}
 */
export function useOutbox(outbox) {
  return useSyncExternalStore(
    outbox ? outbox.subscribe : noSubscription,
    outbox ? () => outbox.state : initial,
    initial,
  );
}

/**
 * sw-outbox/react — the outbox's state in a React component.
 *
 * `useOutbox(outbox)` re-renders its component whenever the outbox's state changes
 * (`outbox.state`, kept current from the worker's reports; see the page helper), through
 * React's `useSyncExternalStore`, so every component reads one consistent snapshot.
 * `useOutbox(outbox, selector)` re-renders it only when what `selector` picks changed
 * (compared with `Object.is`, or the `isEqual` given): a badge showing a count renders
 * when the count changes, not on every report of a replay. React (18 or later) is an
 * optional peer dependency of the package: only this entry needs it.
 *
 * @example
 *   import { registerOutbox } from 'sw-outbox';
 *   import { useOutbox } from 'sw-outbox/react';
 *   const outbox = await registerOutbox();
 *   function PendingBadge() {
 *     const count = useOutbox(outbox, (s) => s.pending.length);
 *     return count ? `${count} waiting` : null;
 *   }
 */
import { useMemo, useSyncExternalStore } from 'react';
import { INITIAL_STATE } from './outbox-client.js';

/**
 * @import { OutboxClient, OutboxState } from './outbox-client.js'
 */

/** For a component rendered before the client exists: nothing changes. */
const noSubscription = () => () => {};
const initial = () => INITIAL_STATE;

/**
 * The outbox's state, re-rendering the component on every change.
 * @overload
 * @param {OutboxClient | null | undefined} outbox the page helper's client
 *   (`registerOutbox()`'s); null or undefined while it is not made yet: the initial
 *   state (`ready: false`, empty lists)
 * @returns {OutboxState}
 */
/**
 * The part of the outbox's state that `selector` picks, re-rendering the component only
 * when that part changed: `selector` runs on each new state, and its result is kept
 * (the same value is returned, nothing renders) while `isEqual(kept, new)` holds. The
 * state's parts keep their identity until they change (`s.pending`, `s.delivery`), so
 * picking one needs no `isEqual`; a selector that builds a new object or array each time
 * does, e.g. a shallow comparison.
 * @template T
 * @overload
 * @param {OutboxClient | null | undefined} outbox as above
 * @param {(state: OutboxState) => T} selector picks what the component shows; it may
 *   change between renders (an inline function)
 * @param {(a: T, b: T) => boolean} [isEqual=Object.is] whether two picks are the same
 * @returns {T}
 */
/**
 * @param {OutboxClient | null | undefined} outbox
 * @param {(state: OutboxState) => unknown} [selector]
 * @param {(a: unknown, b: unknown) => boolean} [isEqual]
 * @returns {unknown}
 */
export function useOutbox(outbox, selector, isEqual = Object.is) {
  const subscribe = outbox ? outbox.subscribe : noSubscription;
  // The snapshots React compares are selections, memoised on the state they were taken
  // from: React calls them often (every render, every change), and a selector that
  // builds a new value each time must still give back the kept one while it is equal,
  // or React would render (or loop) for nothing. A new selector (an inline function)
  // recomputes from the current state once, on the render that brought it.
  const [getSnapshot, getServerSnapshot] = useMemo(() => {
    const getState = outbox ? () => outbox.state : initial;
    if (!selector) return [getState, initial];
    return [selecting(getState, selector, isEqual), selecting(initial, selector, isEqual)];
  }, [outbox, selector, isEqual]);
  return useSyncExternalStore(subscribe, getSnapshot, getServerSnapshot);
}

/**
 * `selector` over `getState`, giving back its previous result while the state is the
 * same object or the new result `isEqual` to it.
 * @param {() => OutboxState} getState
 * @param {(state: OutboxState) => unknown} selector
 * @param {(a: unknown, b: unknown) => boolean} isEqual
 * @returns {() => unknown}
 */
function selecting(getState, selector, isEqual) {
  /** @type {{state: OutboxState, selection: unknown} | null} */
  let memo = null;
  return () => {
    const state = getState();
    if (memo && memo.state === state) return memo.selection;
    const next = selector(state);
    const selection = memo && isEqual(memo.selection, next) ? memo.selection : next;
    memo = { state, selection };
    return selection;
  };
}

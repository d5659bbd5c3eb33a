// The types of `import … from 'sw-outbox'`: the page helper's (generated from the JSDoc
// of outbox-client.js) and every message of the protocol (outbox-protocol.d.ts).
export * from './outbox-protocol.js';
export * from './outbox-client.js';

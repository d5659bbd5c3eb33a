// The types of `import … from 'sw-outbox'`: the page helper's, its state's included
// (generated from the JSDoc of outbox-client.js) and every message of the protocol
// (outbox-protocol.d.ts).
export * from './outbox-protocol.js';
export * from './outbox-client.js';

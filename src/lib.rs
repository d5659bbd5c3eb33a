//! sw-outbox: an offline outbox for Progressive Web Apps, run as the site's service worker.
pub mod core;

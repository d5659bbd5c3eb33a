//! Reading a body up to a size bound without holding more than the bound.

use axum_core::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::stream::{self, StreamExt};

/// A body read up to a bound.
pub(crate) enum Capped {
    /// All of it, within the bound.
    Whole(Bytes),
    /// It is larger: what was read, then the rest still unread, as one body.
    Over(Body),
}

/// Reads `body` until it ends or more than `cap` bytes have arrived. Past the bound it stops
/// reading, so a large body is never buffered beyond `cap` plus one chunk.
pub(crate) async fn read_capped(body: Body, cap: usize) -> Result<Capped, axum_core::Error> {
    let mut data = body.into_data_stream();
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    while let Some(chunk) = data.next().await {
        let chunk = chunk?;
        len = len.saturating_add(chunk.len());
        chunks.push(chunk);
        if len > cap {
            let read = stream::iter(chunks.into_iter().map(Ok::<_, axum_core::Error>));
            return Ok(Capped::Over(Body::from_stream(read.chain(data))));
        }
    }
    Ok(Capped::Whole(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => {
            let mut all = BytesMut::with_capacity(len);
            for c in chunks {
                all.extend_from_slice(&c);
            }
            all.freeze()
        }
    }))
}

/// The declared `Content-Length`, when there is exactly one valid one.
pub(crate) fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let v = values.next()?;
    if values.next().is_some() {
        return None;
    }
    v.to_str().ok()?.trim().parse().ok()
}

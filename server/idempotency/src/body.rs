//! [`IdempotencyBody`]: the one body type the layer hands on, both ways, whatever body
//! type came in; and reading a body up to a size bound without holding more than the bound.

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// The error type of [`IdempotencyBody`]: whatever the wrapped body's error was.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A body as the layer hands it on: to the route (the request) and to the client (the
/// answer). Either bytes the layer holds (a request body it read to fingerprint, a stored
/// answer, its own answers) or the original body, untouched and unbuffered, after any
/// chunks the layer already read from it. Its data is [`Bytes`], so it works with axum,
/// hyper and tower-http like their own bodies.
pub struct IdempotencyBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    Held {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
    // Boxed so the layer can read a prefix and then move the rest on, for any body type
    // (pinned or not).
    Passed {
        prefix: VecDeque<Bytes>,
        inner: Pin<Box<B>>,
    },
}

impl<B> IdempotencyBody<B> {
    /// Bytes held in memory.
    pub fn full(data: impl Into<Bytes>) -> IdempotencyBody<B> {
        IdempotencyBody::held(data.into(), None)
    }

    /// An empty body.
    pub fn empty() -> IdempotencyBody<B> {
        IdempotencyBody::held(Bytes::new(), None)
    }

    /// The body `inner`, passed on as it comes.
    pub fn new(inner: B) -> IdempotencyBody<B> {
        IdempotencyBody::pinned(VecDeque::new(), Box::pin(inner))
    }

    pub(crate) fn held(data: Bytes, trailers: Option<HeaderMap>) -> IdempotencyBody<B> {
        IdempotencyBody {
            kind: Kind::Held {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }

    pub(crate) fn pinned(prefix: VecDeque<Bytes>, inner: Pin<Box<B>>) -> IdempotencyBody<B> {
        IdempotencyBody {
            kind: Kind::Passed { prefix, inner },
        }
    }
}

impl<B> fmt::Debug for IdempotencyBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Held { data, trailers } => f
                .debug_struct("IdempotencyBody::Held")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .field("trailers", &trailers.is_some())
                .finish(),
            Kind::Passed { prefix, .. } => f
                .debug_struct("IdempotencyBody::Passed")
                .field("prefix_chunks", &prefix.len())
                .finish_non_exhaustive(),
        }
    }
}

impl<B> Body for IdempotencyBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Every field is Unpin (the inner body is boxed).
        match &mut self.get_mut().kind {
            Kind::Held { data, trailers } => {
                if let Some(d) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(d))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Kind::Passed { prefix, inner } => {
                if let Some(chunk) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Poll::Ready(match ready!(inner.as_mut().poll_frame(cx)) {
                    None => None,
                    Some(Err(e)) => Some(Err(e.into())),
                    Some(Ok(frame)) => {
                        Some(Ok(frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))))
                    }
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Held { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Passed { prefix, inner } => prefix.is_empty() && inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Held { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Passed { prefix, inner } => {
                let held: u64 = prefix.iter().map(|c| c.len() as u64).sum();
                let hint = inner.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(hint.lower().saturating_add(held));
                if let Some(upper) = hint.upper() {
                    out.set_upper(upper.saturating_add(held));
                }
                out
            }
        }
    }
}

/// A body read up to a bound.
pub(crate) enum Capped<B> {
    /// All of it, within the bound.
    Whole {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// It is larger: what was read, then the rest still unread, as one body.
    Over(IdempotencyBody<B>),
}

/// Reads `body` until it ends or more than `cap` bytes have arrived. Past the bound it stops
/// reading, so a large body is never buffered beyond `cap` plus one chunk.
pub(crate) async fn read_capped<B>(mut body: Pin<Box<B>>, cap: usize) -> Result<Capped<B>, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut chunks: VecDeque<Bytes> = VecDeque::new();
    let mut len = 0usize;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::into)?;
        match frame.into_data() {
            Ok(mut data) => {
                let chunk = data.copy_to_bytes(data.remaining());
                len = len.saturating_add(chunk.len());
                chunks.push_back(chunk);
                if len > cap {
                    return Ok(Capped::Over(IdempotencyBody::pinned(chunks, body)));
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    match &mut trailers {
                        Some(all) => all.extend(t),
                        None => trailers = Some(t),
                    }
                }
            }
        }
    }
    let data = match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.pop_front().unwrap_or_default(),
        _ => {
            let mut all = bytes::BytesMut::with_capacity(len);
            for c in chunks {
                all.extend_from_slice(&c);
            }
            all.freeze()
        }
    };
    Ok(Capped::Whole { data, trailers })
}

/// The declared `Content-Length`, when there is exactly one valid one.
pub(crate) fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let v = values.next()?;
    if values.next().is_some() {
        return None;
    }
    v.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};

    fn stream(
        chunks: Vec<&'static str>,
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>>> {
        StreamBody::new(futures_util::stream::iter(
            chunks.into_iter().map(|c| Ok(Frame::data(Bytes::from(c)))),
        ))
    }

    #[tokio::test]
    async fn within_the_bound_the_body_is_read_whole() {
        let got = read_capped(Box::pin(stream(vec!["ab", "cd", "e"])), 5)
            .await
            .expect("read");
        match got {
            Capped::Whole { data, trailers } => {
                assert_eq!(data, "abcde");
                assert!(trailers.is_none());
            }
            Capped::Over(_) => panic!("within the bound"),
        }
    }

    #[tokio::test]
    async fn over_the_bound_the_rest_is_handed_on_unread_and_nothing_is_lost() {
        let got = read_capped(Box::pin(stream(vec!["ab", "cd", "ef", "gh"])), 3)
            .await
            .expect("read");
        let Capped::Over(rest) = got else {
            panic!("over the bound")
        };
        assert!(!rest.is_end_stream());
        let all = rest.collect().await.expect("rest").to_bytes();
        assert_eq!(all, "abcdefgh");
    }

    #[tokio::test]
    async fn held_bytes_are_one_exact_frame() {
        let b: IdempotencyBody<Full<Bytes>> = IdempotencyBody::full("hello");
        assert_eq!(b.size_hint().exact(), Some(5));
        assert_eq!(b.collect().await.expect("body").to_bytes(), "hello");
        let e: IdempotencyBody<Full<Bytes>> = IdempotencyBody::empty();
        assert!(e.is_end_stream());
        let passed = IdempotencyBody::new(Full::new(Bytes::from_static(b"xyz")));
        assert_eq!(passed.size_hint().exact(), Some(3));
        assert_eq!(passed.collect().await.expect("body").to_bytes(), "xyz");
    }
}

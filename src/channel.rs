//! Channels between the worker's tasks, for one thread: the browser runs a worker's
//! futures on its one thread, so the shared state is an `Rc<RefCell<…>>`, not
//! futures-channel's atomics and locks (built for threads, and several KB of the module).
//! Only what the shell uses: a oneshot and an unbounded queue. Pure std, host-tested.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

/// One value from one sender to one receiver.
pub mod oneshot {
    use super::*;

    struct Shared<T> {
        value: Option<T>,
        waker: Option<Waker>,
        sender_gone: bool,
        receiver_gone: bool,
    }

    pub struct Sender<T>(Rc<RefCell<Shared<T>>>);
    pub struct Receiver<T>(Rc<RefCell<Shared<T>>>);

    /// The sender was dropped without sending.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Canceled;

    pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
        let shared = Rc::new(RefCell::new(Shared {
            value: None,
            waker: None,
            sender_gone: false,
            receiver_gone: false,
        }));
        (Sender(shared.clone()), Receiver(shared))
    }

    impl<T> Sender<T> {
        /// Hands the value over; `Err(value)` when the receiver is gone (nobody waits).
        pub fn send(self, value: T) -> Result<(), T> {
            let waker = {
                let mut s = self.0.borrow_mut();
                if s.receiver_gone {
                    return Err(value);
                }
                s.value = Some(value);
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
            Ok(())
        }
    }

    impl<T> Drop for Sender<T> {
        fn drop(&mut self) {
            let waker = {
                let mut s = self.0.borrow_mut();
                s.sender_gone = true;
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    impl<T> Future for Receiver<T> {
        type Output = Result<T, Canceled>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let mut s = self.0.borrow_mut();
            if let Some(v) = s.value.take() {
                return Poll::Ready(Ok(v));
            }
            if s.sender_gone {
                return Poll::Ready(Err(Canceled));
            }
            s.waker = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    impl<T> Drop for Receiver<T> {
        fn drop(&mut self) {
            self.0.borrow_mut().receiver_gone = true;
        }
    }
}

/// Values in order from any number of senders to one receiver; the receiver sees the
/// end (`None`) once every sender is gone and the queue is empty.
pub mod mpsc {
    use super::*;

    struct Shared<T> {
        queue: VecDeque<T>,
        waker: Option<Waker>,
        senders: usize,
        receiver_gone: bool,
    }

    pub struct UnboundedSender<T>(Rc<RefCell<Shared<T>>>);
    pub struct UnboundedReceiver<T>(Rc<RefCell<Shared<T>>>);

    pub fn unbounded<T>() -> (UnboundedSender<T>, UnboundedReceiver<T>) {
        let shared = Rc::new(RefCell::new(Shared {
            queue: VecDeque::new(),
            waker: None,
            senders: 1,
            receiver_gone: false,
        }));
        (UnboundedSender(shared.clone()), UnboundedReceiver(shared))
    }

    impl<T> UnboundedSender<T> {
        /// Queues the value; `Err(value)` when the receiver is gone.
        pub fn unbounded_send(&self, value: T) -> Result<(), T> {
            let waker = {
                let mut s = self.0.borrow_mut();
                if s.receiver_gone {
                    return Err(value);
                }
                s.queue.push_back(value);
                s.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
            Ok(())
        }
    }

    impl<T> Clone for UnboundedSender<T> {
        fn clone(&self) -> Self {
            self.0.borrow_mut().senders += 1;
            UnboundedSender(self.0.clone())
        }
    }

    impl<T> Drop for UnboundedSender<T> {
        fn drop(&mut self) {
            let waker = {
                let mut s = self.0.borrow_mut();
                s.senders -= 1;
                if s.senders == 0 {
                    s.waker.take()
                } else {
                    None
                }
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    impl<T> UnboundedReceiver<T> {
        pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
            let mut s = self.0.borrow_mut();
            if let Some(v) = s.queue.pop_front() {
                return Poll::Ready(Some(v));
            }
            if s.senders == 0 {
                return Poll::Ready(None);
            }
            s.waker = Some(cx.waker().clone());
            Poll::Pending
        }

        /// The next value, or `None` once every sender is gone and nothing is left.
        pub async fn next(&mut self) -> Option<T> {
            std::future::poll_fn(|cx| self.poll_next(cx)).await
        }
    }

    impl<T> Drop for UnboundedReceiver<T> {
        fn drop(&mut self) {
            let mut s = self.0.borrow_mut();
            s.receiver_gone = true;
            s.queue.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// A waker that counts its wake-ups.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll<F: Future + Unpin>(f: &mut F, waker: &Waker) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_oneshot_delivers_once_sent_and_wakes_its_waiting_receiver() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (tx, mut rx) = oneshot::channel::<u32>();
        assert_eq!(poll(&mut rx, &waker), Poll::Pending);
        assert_eq!(tx.send(7), Ok(()));
        assert!(count.0.load(Ordering::SeqCst) >= 1, "woken");
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Ok(7)));
    }

    #[test]
    fn a_oneshot_whose_sender_is_dropped_is_canceled_and_wakes() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (tx, mut rx) = oneshot::channel::<u32>();
        assert_eq!(poll(&mut rx, &waker), Poll::Pending);
        drop(tx);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Err(oneshot::Canceled)));
    }

    #[test]
    fn sending_to_a_dropped_oneshot_receiver_gives_the_value_back() {
        let (tx, rx) = oneshot::channel::<&str>();
        drop(rx);
        assert_eq!(tx.send("lock"), Err("lock"));
    }

    #[test]
    fn an_unbounded_channel_keeps_order_and_ends_when_every_sender_is_gone() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let (tx, mut rx) = mpsc::unbounded::<u32>();
        assert_eq!(rx.poll_next(&mut cx), Poll::Pending);
        let tx2 = tx.clone();
        tx.unbounded_send(1).expect("open");
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "the waiting receiver is woken"
        );
        tx2.unbounded_send(2).expect("open");
        drop(tx);
        assert_eq!(rx.poll_next(&mut cx), Poll::Ready(Some(1)));
        assert_eq!(rx.poll_next(&mut cx), Poll::Ready(Some(2)));
        assert_eq!(rx.poll_next(&mut cx), Poll::Pending, "one sender is left");
        drop(tx2);
        assert_eq!(rx.poll_next(&mut cx), Poll::Ready(None));
    }

    #[test]
    fn sending_to_a_dropped_unbounded_receiver_gives_the_value_back() {
        let (tx, rx) = mpsc::unbounded::<u32>();
        drop(rx);
        assert_eq!(tx.unbounded_send(3), Err(3));
    }
}

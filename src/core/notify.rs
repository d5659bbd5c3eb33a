//! Delivery notifications, opt-in per account: after a background flush that changed
//! something while no page was open, one notification with no user content in it.

use super::backoff::Trigger;

/// What a flush sent, by kind: the method names the kind of change, never its content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    pub new: usize,
    pub edits: usize,
    pub deletions: usize,
}

impl Sent {
    /// Counts one replayed write of `method`.
    pub fn count(&mut self, method: &str) {
        match method {
            "POST" => self.new += 1,
            "DELETE" => self.deletions += 1,
            _ => self.edits += 1,
        }
    }

    pub fn total(&self) -> usize {
        self.new + self.edits + self.deletions
    }
}

/// The text of the notification for a background flush: how many queued changes were
/// sent, by kind, and how many now need attention. `None` when there is nothing to say.
pub fn summary(sent: &Sent, needs_attention: usize) -> Option<String> {
    let changes = |n: usize| {
        if n == 1 {
            "1 queued change".to_owned()
        } else {
            format!("{n} queued changes")
        }
    };
    let plural = |n: usize, one: &str, many: &str| {
        if n == 1 {
            format!("1 {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let kinds: Vec<String> = [
        (sent.new, "new", "new"),
        (sent.edits, "edit", "edits"),
        (sent.deletions, "deletion", "deletions"),
    ]
    .into_iter()
    .filter(|(n, _, _)| *n > 0)
    .map(|(n, one, many)| plural(n, one, many))
    .collect();
    let r = sent.total();
    let sent_text = format!(
        "{} {} sent: {}",
        changes(r),
        if r == 1 { "was" } else { "were" },
        kinds.join(", ")
    );
    let attention = |a: usize| if a == 1 { "needs" } else { "need" };
    match (r, needs_attention) {
        (0, 0) => None,
        (_, 0) => Some(sent_text),
        (0, a) => Some(format!("{} {} attention", changes(a), attention(a))),
        (_, a) => Some(format!("{sent_text}; {a} {} attention", attention(a))),
    }
}

/// Where a click on the notification leads: `notificationUrl`, at the first record that
/// needs attention when there is one (`?outboxRecord=<id>`), so the app can open its
/// recovery view on it.
pub fn click_url(notification_url: &str, first_attention: Option<u64>) -> String {
    match first_attention {
        None => notification_url.to_owned(),
        Some(id) => {
            let sep = if notification_url.contains('?') {
                '&'
            } else {
                '?'
            };
            format!("{notification_url}{sep}outboxRecord={id}")
        }
    }
}

/// Whether a flush should end with a notification: only a background flush (a page's
/// own flush tells the page), only when no window of the app is open to show the
/// reports, only when the signed-in account opted in and the browser granted the
/// permission (which only a page can ask for).
pub fn should_notify(trigger: Trigger, windows_open: bool, opted_in: bool, granted: bool) -> bool {
    trigger.is_automatic() && !windows_open && opted_in && granted
}

/// Whether a notification click may open `url` (given as its origin and path): only on
/// the worker's own origin exactly, and under `notification_url`'s path at a segment
/// boundary (`/app` allows `/app`, `/app/x` and `/app?x`, never `/apple`). Any other URL
/// in a notification's data is not followed: `notificationUrl` itself is opened instead.
pub fn click_target_allowed(
    url_origin: &str,
    url_path: &str,
    origin: &str,
    notification_url: &str,
) -> bool {
    let prefix = notification_url
        .split(['?', '#'])
        .next()
        .unwrap_or(notification_url);
    if url_origin != origin || !url_path.starts_with('/') {
        return false;
    }
    match url_path.strip_prefix(prefix) {
        None => false,
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn a_click_opens_only_this_origin_under_the_notification_url() {
        let o = "https://app.example";
        assert!(click_target_allowed(o, "/", o, "/"));
        assert!(click_target_allowed(o, "/projects/1", o, "/"));
        assert!(click_target_allowed(o, "/app", o, "/app"));
        assert!(click_target_allowed(o, "/app/", o, "/app?tab=2"));
        assert!(click_target_allowed(o, "/app/inbox", o, "/app"));
        assert!(
            !click_target_allowed(o, "/apple", o, "/app"),
            "a bare prefix"
        );
        assert!(!click_target_allowed(o, "/other", o, "/app/"));
        // An origin that merely starts like this one's is another origin.
        assert!(!click_target_allowed(
            "https://app.example.evil.test",
            "/",
            o,
            "/"
        ));
        assert!(!click_target_allowed(
            "https://app.example:8443",
            "/",
            o,
            "/"
        ));
        assert!(!click_target_allowed("null", "/", o, "/"));
    }

    fn sent(methods: &[&str]) -> Sent {
        let mut s = Sent::default();
        for m in methods {
            s.count(m);
        }
        s
    }

    #[test]
    fn the_text_counts_by_kind_and_says_nothing_else() {
        assert_eq!(summary(&Sent::default(), 0), None);
        assert_eq!(
            summary(&sent(&["POST"]), 0).as_deref(),
            Some("1 queued change was sent: 1 new")
        );
        assert_eq!(
            summary(&sent(&["POST", "PATCH", "PUT", "DELETE"]), 0).as_deref(),
            Some("4 queued changes were sent: 1 new, 2 edits, 1 deletion")
        );
        assert_eq!(
            summary(&Sent::default(), 1).as_deref(),
            Some("1 queued change needs attention")
        );
        assert_eq!(
            summary(&Sent::default(), 2).as_deref(),
            Some("2 queued changes need attention")
        );
        assert_eq!(
            summary(&sent(&["POST", "POST"]), 1).as_deref(),
            Some("2 queued changes were sent: 2 new; 1 needs attention")
        );
    }

    #[test]
    fn a_click_leads_to_the_first_record_that_needs_attention() {
        assert_eq!(click_url("/", None), "/");
        assert_eq!(click_url("/", Some(7)), "/?outboxRecord=7");
        assert_eq!(
            click_url("/app?tab=2", Some(7)),
            "/app?tab=2&outboxRecord=7"
        );
    }

    #[test]
    fn only_background_flushes_with_no_window_open_for_an_opted_in_account() {
        for t in [
            Trigger::Sync,
            Trigger::Online,
            Trigger::Start,
            Trigger::Retry,
        ] {
            assert!(should_notify(t, false, true, true), "{t:?}");
            assert!(!should_notify(t, true, true, true), "a page is open: {t:?}");
            assert!(!should_notify(t, false, false, true), "not opted in: {t:?}");
            assert!(
                !should_notify(t, false, true, false),
                "no permission: {t:?}"
            );
        }
        assert!(!should_notify(Trigger::Page, false, true, true));
        assert!(!should_notify(Trigger::Recovery, false, true, true));
    }
}

//! Delivery notifications, opt-in per account: after a background flush that changed
//! something while no page was open, one notification with no user content in it.

use super::backoff::Trigger;

/// The text of the notification for a background flush: how many queued changes were
/// sent and how many now need attention. `None` when there is nothing to say.
pub fn summary(replayed: usize, needs_attention: usize) -> Option<String> {
    let changes = |n: usize| {
        if n == 1 {
            "1 queued change".to_owned()
        } else {
            format!("{n} queued changes")
        }
    };
    match (replayed, needs_attention) {
        (0, 0) => None,
        (r, 0) => Some(format!(
            "{} {} sent",
            changes(r),
            if r == 1 { "was" } else { "were" }
        )),
        (0, a) => Some(format!(
            "{} {} attention",
            changes(a),
            if a == 1 { "needs" } else { "need" }
        )),
        (r, a) => Some(format!(
            "{} {} sent; {} {} attention",
            changes(r),
            if r == 1 { "was" } else { "were" },
            a,
            if a == 1 { "needs" } else { "need" }
        )),
    }
}

/// Whether a flush should end with a notification: only a background flush (a page's
/// own flush tells the page), only when no window of the app is open to show the
/// reports, only when the signed-in account opted in and the browser granted the
/// permission (which only a page can ask for).
pub fn should_notify(trigger: Trigger, windows_open: bool, opted_in: bool, granted: bool) -> bool {
    trigger.is_automatic() && !windows_open && opted_in && granted
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn the_text_counts_and_says_nothing_else() {
        assert_eq!(summary(0, 0), None);
        assert_eq!(summary(1, 0).as_deref(), Some("1 queued change was sent"));
        assert_eq!(summary(3, 0).as_deref(), Some("3 queued changes were sent"));
        assert_eq!(
            summary(0, 1).as_deref(),
            Some("1 queued change needs attention")
        );
        assert_eq!(
            summary(0, 2).as_deref(),
            Some("2 queued changes need attention")
        );
        assert_eq!(
            summary(2, 1).as_deref(),
            Some("2 queued changes were sent; 1 needs attention")
        );
    }

    #[test]
    fn only_background_flushes_with_no_window_open_for_an_opted_in_account() {
        for t in [Trigger::Sync, Trigger::Online, Trigger::Start] {
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

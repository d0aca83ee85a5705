//! Who is acting on the current thread, for writes made deep inside another domain's rules
//! (a survey's targeting flag, an experiment's flag): the facade that knows the user runs its
//! blocking work under [`acting_as`], and the write it reaches logs [`current_actor`]. Work
//! outside any `acting_as` is Corvid's own (the system actor).

use std::cell::RefCell;

use super::entry::Actor;

thread_local! {
    static ACTING: RefCell<Option<Actor>> = const { RefCell::new(None) };
}

/// Runs `work` on this thread with `actor` as the acting user (restored after, also when
/// `work` panics).
pub fn acting_as<T>(actor: &Actor, work: impl FnOnce() -> T) -> T {
    struct Restore(Option<Actor>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            ACTING.with(|a| *a.borrow_mut() = previous);
        }
    }
    let previous = ACTING.with(|a| a.borrow_mut().replace(actor.clone()));
    let _restore = Restore(previous);
    work()
}

/// The user [`acting_as`] set on this thread, or the system.
pub fn current_actor() -> Actor {
    ACTING
        .with(|a| a.borrow().clone())
        .unwrap_or_else(Actor::system)
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    #[test]
    fn the_actor_holds_inside_and_is_restored_after() {
        let ada = Actor::user(1, Uuid::nil(), "ada@example.com", "Ada");
        assert!(current_actor().is_system);
        let inner = acting_as(&ada, || {
            let nested = acting_as(&Actor::system(), || current_actor().is_system);
            (nested, current_actor())
        });
        assert_eq!(inner, (true, ada));
        assert!(current_actor().is_system);
    }
}

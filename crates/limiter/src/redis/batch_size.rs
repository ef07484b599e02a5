//! The size of the backend batch a request's decision went in, for its
//! trace: how many decisions the Redis client sent in the same round trip
//! as this one. Carried out of the limiter beside its answer (not through
//! [`crate::Limiter`]'s return), and only while someone asks for it.

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static OBSERVED: Cell<usize>;
}

/// Runs `decide`, returning its output and the largest batch any of its
/// backend calls went in; `None` when no call was batched (a local
/// backend, the deny cache, a failure policy, a call that never left).
pub async fn observed<F: Future>(decide: F) -> (F::Output, Option<usize>) {
    OBSERVED
        .scope(Cell::new(0), async move {
            let output = decide.await;
            let size = OBSERVED.with(Cell::get);
            (output, (size > 0).then_some(size))
        })
        .await
}

/// Notes that a decision of the current request went in a batch of `size`
/// decisions; nothing when nobody observes the request.
pub(crate) fn note(size: usize) {
    let _ = OBSERVED.try_with(|observed| observed.set(observed.get().max(size)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_largest_batch_noted_is_observed() {
        let (value, size) = observed(async {
            note(3);
            note(7);
            note(2);
            "decided"
        })
        .await;
        assert_eq!((value, size), ("decided", Some(7)));
    }

    #[tokio::test]
    async fn nothing_noted_is_none_and_unobserved_notes_are_harmless() {
        note(5);
        let ((), size) = observed(async {}).await;
        assert_eq!(size, None);
    }
}

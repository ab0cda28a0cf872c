//! The queue as the queue-level tests drive it (no HTTP): the completion they report.

use pullman::queue::Completion;

/// A plain completion: `success` or not, no message, retryable, not a disruption. The report
/// every queue-level test makes when only the end of the claim matters.
pub fn done(success: bool) -> Completion {
    Completion {
        success,
        message: None,
        retryable: true,
        disrupted: false,
    }
}

//! The label values of valve's own reasons: why a worker left the pool, why
//! valve answered a request itself.

/// Why a worker left the pool (the `reason` label of `valve_worker_exits_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitReason {
    Idle,
    Recycled,
    Memory,
    Timeout,
    Broken,
    Unresponsive,
    Budget,
    Shutdown,
    Crashed,
    FailedStart,
}

impl ExitReason {
    pub(crate) const ALL: [ExitReason; 10] = [
        ExitReason::Idle,
        ExitReason::Recycled,
        ExitReason::Memory,
        ExitReason::Timeout,
        ExitReason::Broken,
        ExitReason::Unresponsive,
        ExitReason::Budget,
        ExitReason::Shutdown,
        ExitReason::Crashed,
        ExitReason::FailedStart,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Idle => "idle",
            ExitReason::Recycled => "max_requests",
            ExitReason::Memory => "max_memory",
            ExitReason::Timeout => "request_timeout",
            ExitReason::Broken => "broken",
            ExitReason::Unresponsive => "unresponsive",
            ExitReason::Budget => "budget",
            ExitReason::Shutdown => "shutdown",
            ExitReason::Crashed => "crashed",
            ExitReason::FailedStart => "failed_start",
        }
    }
}

/// Why valve answered a request itself (`valve_rejected_requests_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    QueueFull,
    QueueTimeout,
    ShuttingDown,
    BodyTooLarge,
    WorkerFailed,
    RequestTimeout,
    BadRequest,
    /// The app's allow lists refused the caller (403).
    AccessDenied,
    /// A browser without an identity was sent to the sign-in URL (302).
    SignIn,
    /// The forward-auth service could not say who is calling (503).
    AuthUnavailable,
}

impl Rejection {
    pub(crate) const ALL: [Rejection; 10] = [
        Rejection::QueueFull,
        Rejection::QueueTimeout,
        Rejection::ShuttingDown,
        Rejection::BodyTooLarge,
        Rejection::WorkerFailed,
        Rejection::RequestTimeout,
        Rejection::BadRequest,
        Rejection::AccessDenied,
        Rejection::SignIn,
        Rejection::AuthUnavailable,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue_full",
            Rejection::QueueTimeout => "queue_timeout",
            Rejection::ShuttingDown => "shutting_down",
            Rejection::BodyTooLarge => "body_too_large",
            Rejection::WorkerFailed => "worker_failed",
            Rejection::RequestTimeout => "request_timeout",
            Rejection::BadRequest => "bad_request",
            Rejection::AccessDenied => "access_denied",
            Rejection::SignIn => "sign_in",
            Rejection::AuthUnavailable => "auth_unavailable",
        }
    }
}

//! The decision after one try of a request on a worker: what becomes of the
//! worker (given back, retired and why, left to finish R's work, left
//! serving its other Shiny sessions), and whether the request goes to
//! another worker or the client gets valve's answer. Pure: the forwarder
//! reports what happened and obeys; a lease dropped mid-exchange (its client
//! left) asks the same function.

use std::time::Duration;

use http::StatusCode;

use super::pool::Retire;
use crate::metrics::Rejection;
use crate::worker::Exit;

/// How many times a request that never reached a worker (its connection
/// refused) is tried before the client gets 502.
pub const CONNECT_TRIES: usize = 3;

/// How a request holds its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A plumber worker, leased for this one request.
    Lease,
    /// A Shiny worker, shared by every request and session of its browsers.
    Sticky,
}

/// The request, as far as the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    pub hold: Hold,
    /// A bodyless GET, HEAD or OPTIONS, which R can safely be asked twice.
    pub replayable: bool,
    /// Tries so far whose worker could not be reached (this one included).
    pub unreachable: usize,
    /// A try already went to another worker after its worker died.
    pub retried: bool,
}

/// What happened to one try.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The worker answered; `reusable` if its connection can serve again.
    Answered { reusable: bool },
    /// No connection could be made: nothing was sent.
    Unreachable,
    /// No answer within `--request-timeout`, R computing the request.
    TimedOut(Duration),
    /// No answer within `--request-timeout`, the request waiting on a promise
    /// that never settled while R served others.
    Unsettled(Duration),
    /// The worker broke valve's protocol: nothing it said can be trusted.
    Garbage,
    /// The exchange broke off; the worker's exit, if it was seen soon after.
    Failed(Option<Exit>),
    /// The client left while R worked on the request.
    ClientGone,
}

/// What becomes of the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Back to the pool, with its connection if `reusable`.
    GiveBack { reusable: bool },
    /// Out of service before anyone else can have it.
    Retire(Retire),
    /// R is still busy with the request: it comes back once a probe says R is done.
    Settle,
    /// A Shiny worker goes on serving its other sessions.
    Keep,
    /// R holds the request only as a promise and computes nothing for it:
    /// the worker serves on, and its late answer is dropped.
    Detach,
}

/// What the client gets from valve instead of R's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    pub rejection: Rejection,
}

/// What the request does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// The worker's answer goes to the client.
    Deliver,
    /// The request goes to another worker.
    Retry,
    /// The client gets valve's answer.
    Refuse(Refusal),
    /// Nobody is waiting for an answer.
    Nothing,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub fate: Fate,
    pub next: Next,
}

/// Decides what follows `outcome` for the request `asked`.
pub fn after_exchange(outcome: &Outcome, asked: Asked) -> Verdict {
    let fate = fate(outcome, asked.hold);
    let next = match outcome {
        Outcome::Answered { .. } => Next::Deliver,
        Outcome::ClientGone => Next::Nothing,
        // Nothing was sent, so any request may go to another worker.
        Outcome::Unreachable if asked.unreachable < CONNECT_TRIES => Next::Retry,
        Outcome::Unreachable => refuse(StatusCode::BAD_GATEWAY, "no R worker could be reached".into()),
        Outcome::Unsettled(limit) => Next::Refuse(Refusal {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!(
                "the endpoint's promise did not settle within --request-timeout ({}s); the R worker serves on",
                limit.as_secs_f64()
            ),
            rejection: Rejection::RequestTimeout,
        }),
        Outcome::TimedOut(limit) => Next::Refuse(Refusal {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!(
                "the R worker took longer than --request-timeout ({}s) and was restarted",
                limit.as_secs_f64()
            ),
            rejection: Rejection::RequestTimeout,
        }),
        // Not retried: the worker answered, but nothing it said can be trusted.
        Outcome::Garbage => {
            refuse(StatusCode::BAD_GATEWAY, "the R worker sent an answer valve cannot read; it was replaced".into())
        }
        // The request ended its worker: a second worker would die the same way.
        Outcome::Failed(Some(exit)) if exit.self_inflicted() => refuse(
            StatusCode::BAD_GATEWAY,
            format!("the request ended its R worker ({}); it was not retried", exit.describe()),
        ),
        Outcome::Failed(_) if asked.replayable && !asked.retried => Next::Retry,
        Outcome::Failed(_) => refuse(StatusCode::BAD_GATEWAY, "the R worker died while handling the request".into()),
    };
    Verdict { fate, next }
}

/// A leased worker that failed is retired before anyone else can have it; a
/// Shiny worker serves other sessions, so only a refused connection or a
/// timeout (R stuck for all of them) retires it.
fn fate(outcome: &Outcome, hold: Hold) -> Fate {
    match (outcome, hold) {
        (Outcome::Answered { reusable }, Hold::Lease) => Fate::GiveBack { reusable: *reusable },
        (Outcome::ClientGone, Hold::Lease) => Fate::Settle,
        (Outcome::TimedOut(_), _) => Fate::Retire(Retire::Timeout),
        (Outcome::Unsettled(_), Hold::Lease) => Fate::Detach,
        (Outcome::Unsettled(_), Hold::Sticky) => Fate::Keep,
        (Outcome::Unreachable, _) => Fate::Retire(Retire::Broken),
        (Outcome::Garbage | Outcome::Failed(_), Hold::Lease) => Fate::Retire(Retire::Broken),
        (Outcome::Answered { .. } | Outcome::ClientGone | Outcome::Garbage | Outcome::Failed(_), Hold::Sticky) => {
            Fate::Keep
        }
    }
}

fn refuse(status: StatusCode, message: String) -> Next {
    Next::Refuse(Refusal { status, message, rejection: Rejection::WorkerFailed })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: Asked = Asked { hold: Hold::Lease, replayable: true, unreachable: 0, retried: false };
    const POST: Asked = Asked { hold: Hold::Lease, replayable: false, unreachable: 0, retried: false };

    fn shiny(a: Asked) -> Asked {
        Asked { hold: Hold::Sticky, ..a }
    }

    fn refused(v: &Verdict) -> (StatusCode, &str, Rejection) {
        match &v.next {
            Next::Refuse(r) => (r.status, r.message.as_str(), r.rejection),
            other => panic!("a refusal, not {other:?}"),
        }
    }

    #[test]
    fn an_answer_is_delivered_and_a_leased_worker_goes_back() {
        for reusable in [true, false] {
            let v = after_exchange(&Outcome::Answered { reusable }, POST);
            assert_eq!(v, Verdict { fate: Fate::GiveBack { reusable }, next: Next::Deliver });
        }
        let v = after_exchange(&Outcome::Answered { reusable: false }, shiny(GET));
        assert_eq!(v, Verdict { fate: Fate::Keep, next: Next::Deliver }, "a Shiny worker is not leased");
    }

    #[test]
    fn a_worker_killed_from_outside_is_retired_and_only_a_replayable_request_is_sent_again_once() {
        for exit in [Some(Exit::Signal(9)), None] {
            let killed = Outcome::Failed(exit.clone());
            for get in [GET, shiny(GET)] {
                let v = after_exchange(&killed, get);
                assert_eq!(v.next, Next::Retry, "{exit:?} {get:?}");
                let again = after_exchange(&killed, Asked { retried: true, ..get });
                assert_eq!(refused(&again).1, "the R worker died while handling the request", "once only");
            }
            for post in [POST, shiny(POST)] {
                let v = after_exchange(&killed, post);
                assert_eq!(
                    refused(&v),
                    (StatusCode::BAD_GATEWAY, "the R worker died while handling the request", Rejection::WorkerFailed)
                );
            }
            assert_eq!(after_exchange(&killed, GET).fate, Fate::Retire(Retire::Broken));
            assert_eq!(after_exchange(&killed, shiny(GET)).fate, Fate::Keep, "it serves other sessions, if alive");
        }
    }

    #[test]
    fn a_request_that_ended_its_worker_is_never_retried() {
        for exit in [Exit::Code(3), Exit::Signal(11)] {
            assert!(exit.self_inflicted());
            for asked in [GET, POST, shiny(GET)] {
                let v = after_exchange(&Outcome::Failed(Some(exit.clone())), asked);
                let (status, message, rejection) = refused(&v);
                assert_eq!((status, rejection), (StatusCode::BAD_GATEWAY, Rejection::WorkerFailed));
                assert_eq!(
                    message,
                    format!("the request ended its R worker ({}); it was not retried", exit.describe())
                );
            }
        }
    }

    #[test]
    fn a_promise_that_never_settles_answers_504_and_leaves_its_worker_serving() {
        let limit = Duration::from_secs(2);
        for asked in [GET, POST] {
            let v = after_exchange(&Outcome::Unsettled(limit), asked);
            assert_eq!(v.fate, Fate::Detach, "the worker serves its other requests");
            assert_eq!(
                refused(&v),
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    "the endpoint's promise did not settle within --request-timeout (2s); the R worker serves on",
                    Rejection::RequestTimeout
                )
            );
        }
    }

    #[test]
    fn a_timeout_retires_the_worker_leased_or_shared_and_answers_504() {
        let limit = Duration::from_millis(1500);
        for asked in [GET, POST, shiny(GET), shiny(POST)] {
            let v = after_exchange(&Outcome::TimedOut(limit), asked);
            assert_eq!(v.fate, Fate::Retire(Retire::Timeout));
            assert_eq!(
                refused(&v),
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    "the R worker took longer than --request-timeout (1.5s) and was restarted",
                    Rejection::RequestTimeout
                )
            );
        }
    }

    #[test]
    fn a_bad_answer_retires_a_leased_worker_and_is_not_retried() {
        for asked in [GET, POST] {
            let v = after_exchange(&Outcome::Garbage, asked);
            assert_eq!(v.fate, Fate::Retire(Retire::Broken));
            assert_eq!(refused(&v).1, "the R worker sent an answer valve cannot read; it was replaced");
        }
        assert_eq!(after_exchange(&Outcome::Garbage, shiny(GET)).fate, Fate::Keep);
    }

    #[test]
    fn an_unreachable_worker_is_retired_and_any_request_tries_another_up_to_connect_tries() {
        for base in [GET, POST, shiny(GET), shiny(POST)] {
            for tries in 1..CONNECT_TRIES {
                let v = after_exchange(&Outcome::Unreachable, Asked { unreachable: tries, ..base });
                assert_eq!(v, Verdict { fate: Fate::Retire(Retire::Broken), next: Next::Retry }, "nothing was sent");
            }
            let last = after_exchange(&Outcome::Unreachable, Asked { unreachable: CONNECT_TRIES, ..base });
            assert_eq!(
                refused(&last),
                (StatusCode::BAD_GATEWAY, "no R worker could be reached", Rejection::WorkerFailed)
            );
        }
    }

    #[test]
    fn a_client_gone_mid_request_leaves_a_leased_worker_to_finish_r_s_work() {
        for asked in [GET, POST] {
            assert_eq!(
                after_exchange(&Outcome::ClientGone, asked),
                Verdict { fate: Fate::Settle, next: Next::Nothing }
            );
        }
        assert_eq!(after_exchange(&Outcome::ClientGone, shiny(POST)).fate, Fate::Keep);
    }
}

//! The schedule crate's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ScheduleError {
    #[error("the scheduled kernels do not verify (a bug in mlopt's schedules):\n{}", .0.join("\n"))]
    Verify(Vec<String>),
    #[error("internal error (a bug in mlopt's schedules): {0}")]
    Internal(String),
    #[error(transparent)]
    Step(#[from] mlopt_kir::sched::SchedError),
}

pub type Result<T, E = ScheduleError> = std::result::Result<T, E>;

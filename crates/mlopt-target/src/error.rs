//! The target crate's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TargetError {
    #[error("unknown target '{name}' (known: {known})")]
    Unknown { name: String, known: String },
    #[error("calibration: {0} (the measurement loop was optimised away or mistimed)")]
    Calibration(String),
}

pub type Result<T, E = TargetError> = std::result::Result<T, E>;

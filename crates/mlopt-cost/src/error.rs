//! The cost crate's one error type.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CostError {
    #[error("unknown target '{name}' (known: {known})")]
    UnknownTarget { name: String, known: String },
    #[error("calibration: {0} (the measurement loop was optimised away or mistimed)")]
    Calibration(String),
}

pub type Result<T, E = CostError> = std::result::Result<T, E>;

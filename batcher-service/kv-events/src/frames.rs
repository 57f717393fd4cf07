//! The ZeroMQ frames of vLLM's KV events, read into a sequence number and a payload, and
//! the replay request written.
//!
//! - Live, from the PUB socket: `[topic, seq, payload]`.
//! - Replay, from the ROUTER socket to a DEALER: `["", seq, payload]` (vLLM <= 0.25) or
//!   `["", topic, seq, payload]` (>= 0.26), the empty delimiter kept by the DEALER; the
//!   last reply's seq is [`crate::stream::END_OF_REPLAY`] and its payload may be empty.
//! - The request: `["", start_seq]`.
//!
//! Every sequence number is 8 bytes, big-endian. Pure, so the subscriber's socket code only
//! moves frames.

/// Why frames are not a KV events message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not the number of frames the socket sends.
    #[error("{0} frames, not a KV events message")]
    Frames(usize),
    /// The sequence number is not 8 bytes.
    #[error("a sequence number of {0} bytes, not 8")]
    Seq(usize),
    /// A replay reply without its empty delimiter frame.
    #[error("a replay reply whose first frame is not empty")]
    Delimiter,
}

fn seq(bytes: &[u8]) -> Result<u64, FrameError> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| FrameError::Seq(bytes.len()))?;
    Ok(u64::from_be_bytes(array))
}

/// A live message `[topic, seq, payload]`: its sequence number and payload.
pub fn live<B: AsRef<[u8]>>(frames: &[B]) -> Result<(u64, &[u8]), FrameError> {
    match frames {
        [_topic, number, payload] => Ok((seq(number.as_ref())?, payload.as_ref())),
        _ => Err(FrameError::Frames(frames.len())),
    }
}

/// A replay reply, with or without the topic frame: its sequence number and payload.
pub fn replay<B: AsRef<[u8]>>(frames: &[B]) -> Result<(u64, &[u8]), FrameError> {
    let (delimiter, number, payload) = match frames {
        [delimiter, number, payload] | [delimiter, _, number, payload] => {
            (delimiter, number, payload)
        }
        _ => return Err(FrameError::Frames(frames.len())),
    };
    if !delimiter.as_ref().is_empty() {
        return Err(FrameError::Delimiter);
    }
    Ok((seq(number.as_ref())?, payload.as_ref()))
}

/// The frames of a replay request for every batch from `start` on.
pub fn replay_request(start: u64) -> [Vec<u8>; 2] {
    [Vec::new(), start.to_be_bytes().to_vec()]
}

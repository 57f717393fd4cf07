//! The ZeroMQ frames: live and both replay forms, the end marker, the request, and frames
//! that are not a KV events message.

use cohort_kv_events::frames::{live, replay, replay_request, FrameError};
use cohort_kv_events::stream::END_OF_REPLAY;

#[test]
fn live_and_replay_frames_give_the_sequence_number_and_payload() {
    let seq = 258u64.to_be_bytes();
    assert_eq!(
        live(&[&b""[..], &seq, b"payload"]),
        Ok((258, &b"payload"[..]))
    );
    assert_eq!(
        live(&[&b"kv@replica-1"[..], &seq, b""]),
        Ok((258, &b""[..]))
    );
    // <= 0.25: ["", seq, payload]; >= 0.26: ["", topic, seq, payload].
    assert_eq!(replay(&[&b""[..], &seq, b"p"]), Ok((258, &b"p"[..])));
    assert_eq!(
        replay(&[&b""[..], b"topic", &seq, b"p"]),
        Ok((258, &b"p"[..]))
    );
    // The end marker: -1 as 8 bytes, an empty payload.
    assert_eq!(
        replay(&[&b""[..], &[0xff; 8], b""]),
        Ok((END_OF_REPLAY, &b""[..]))
    );
}

#[test]
fn other_frames_are_errors() {
    let seq = 1u64.to_be_bytes();
    assert_eq!(live(&[&seq[..], b"p"]), Err(FrameError::Frames(2)));
    assert_eq!(live(&[&b""[..], &seq[..4], b"p"]), Err(FrameError::Seq(4)));
    assert_eq!(replay(&[&b"x"[..], &seq, b"p"]), Err(FrameError::Delimiter));
    assert_eq!(replay::<&[u8]>(&[]), Err(FrameError::Frames(0)));
}

#[test]
fn the_replay_request_is_an_empty_frame_and_the_start_big_endian() {
    assert_eq!(
        replay_request(0x0102),
        [Vec::new(), vec![0, 0, 0, 0, 0, 0, 1, 2]]
    );
}

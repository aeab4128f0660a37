//! The gRPC codec every generated service and client uses: prost's, except
//! that a message that does not decode is the caller's fault.
//!
//! tonic answers an undecodable request `INTERNAL`, which tells a gateway
//! the server broke and invites a retry of the same bytes. A malformed
//! protobuf is bad input: `INVALID_ARGUMENT`, with prost's reason (which
//! field, which wire type).

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Prost encoding, with decode failures answered `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct StrictCodec<T, U> {
    _types: PhantomData<(T, U)>,
}

impl<T, U> Codec for StrictCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = StrictDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

/// [`ProstDecoder`] with its `INTERNAL` decode errors turned into `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct StrictDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for StrictDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(src).map_err(|status| match status.code() {
            Code::Internal => {
                Status::invalid_argument(format!("malformed protobuf: {}", status.message()))
            }
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

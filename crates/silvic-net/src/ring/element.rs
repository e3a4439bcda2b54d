//! The element codec: the number types the ring reduces, as the little-endian bytes payloads
//! carry.
//!
//! Invariants: a payload is an element slice's memory as it lies (the crate builds for
//! little-endian targets only), so sending needs no copy, and [`Element::from_le`] reads back
//! exactly the bits sent: no value is ever converted, rounded or normalised on its way (a NaN
//! keeps its payload).

/// Bytes of one element on the wire.
pub(crate) const ELEMENT_BYTES: usize = 8;

/// A number type the ring reduces. Payloads carry its little-endian bytes.
pub(crate) trait Element: bytemuck::Pod {
    fn from_le(bytes: [u8; ELEMENT_BYTES]) -> Self;
}

impl Element for f64 {
    fn from_le(bytes: [u8; ELEMENT_BYTES]) -> Self {
        f64::from_le_bytes(bytes)
    }
}

impl Element for i64 {
    fn from_le(bytes: [u8; ELEMENT_BYTES]) -> Self {
        i64::from_le_bytes(bytes)
    }
}

/// The elements in `bytes`, a whole number of them, in order.
pub(crate) fn elements<T: Element>(bytes: &[u8]) -> impl Iterator<Item = T> + '_ {
    bytes.chunks_exact(ELEMENT_BYTES).map(|c| T::from_le(c.try_into().expect("whole elements")))
}

/// An element slice as the payload bytes that carry it.
pub(crate) fn as_bytes<T: Element>(values: &[T]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// An element slice as payload bytes to be written.
pub(crate) fn as_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_come_back_with_every_bit() {
        let values = [f64::NAN, -0.0, f64::from_bits(0x7ff4_0000_0000_0001), 1e308, f64::MIN];
        let back: Vec<f64> = elements(as_bytes(&values)).collect();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back), bits(&values));
        let ints = [i64::MIN, -1, 0, i64::MAX];
        assert_eq!(elements::<i64>(as_bytes(&ints)).collect::<Vec<_>>(), ints);
        assert_eq!(as_bytes(&[1i64])[0], 1, "little-endian");
    }
}

//! Just enough PNG to check a browser's screenshots: 8-bit RGB or RGBA, not interlaced
//! (what Chromium writes), decoded to pixels.

use std::io::Read as _;

pub struct Image {
    pub width: usize,
    pub height: usize,
    /// RGB triples, row by row.
    pub rgb: Vec<[u8; 3]>,
}

impl Image {
    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        self.rgb[y * self.width + x]
    }

    /// The variance of the pixels' brightness in the rectangle (clipped to the image):
    /// near 0 for a blank area, large where there is text.
    pub fn variance(&self, x: usize, y: usize, w: usize, h: usize) -> f64 {
        let values: Vec<f64> = self
            .region(x, y, w, h)
            .map(|[r, g, b]| (f64::from(r) + f64::from(g) + f64::from(b)) / 3.0)
            .collect();
        let n = values.len().max(1) as f64;
        let mean = values.iter().sum::<f64>() / n;
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n
    }

    /// Pixels in the rectangle (clipped to the image).
    pub fn region(&self, x: usize, y: usize, w: usize, h: usize) -> impl Iterator<Item = [u8; 3]> {
        let (x1, y1) = ((x + w).min(self.width), (y + h).min(self.height));
        (y.min(y1)..y1).flat_map(move |py| (x.min(x1)..x1).map(move |px| self.pixel(px, py)))
    }
}

pub fn decode(bytes: &[u8]) -> anyhow::Result<Image> {
    anyhow::ensure!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let (mut pos, mut header, mut data) = (8, None, Vec::new());
    while pos + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into()?) as usize;
        let kind = &bytes[pos + 4..pos + 8];
        let body = bytes
            .get(pos + 8..pos + 8 + len)
            .ok_or_else(|| anyhow::anyhow!("short chunk"))?;
        match kind {
            b"IHDR" => {
                header = Some((be(&body[0..4]), be(&body[4..8]), body[8], body[9], body[12]))
            }
            b"IDAT" => data.extend_from_slice(body),
            b"IEND" => break,
            _ => {}
        }
        pos += 12 + len;
    }
    let (width, height, depth, color, interlace) =
        header.ok_or_else(|| anyhow::anyhow!("no IHDR"))?;
    let channels = match color {
        2 => 3,
        6 => 4,
        c => anyhow::bail!("colour type {c} not supported"),
    };
    anyhow::ensure!(
        depth == 8 && interlace == 0,
        "depth {depth}, interlace {interlace}"
    );
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(&data[..]).read_to_end(&mut raw)?;
    let pixels = unfilter(&raw, width, height, channels)?;
    let rgb = pixels
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    Ok(Image { width, height, rgb })
}

fn be(b: &[u8]) -> usize {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

/// Undo each row's filter (PNG spec, section 9).
fn unfilter(raw: &[u8], width: usize, height: usize, bpp: usize) -> anyhow::Result<Vec<u8>> {
    let stride = width * bpp;
    anyhow::ensure!(raw.len() >= height * (stride + 1), "short image data");
    let mut out = vec![0u8; height * stride];
    for y in 0..height {
        let filter = raw[y * (stride + 1)];
        let src = &raw[y * (stride + 1) + 1..(y + 1) * (stride + 1)];
        for i in 0..stride {
            let a = if i >= bpp {
                out[y * stride + i - bpp]
            } else {
                0
            };
            let b = if y > 0 { out[(y - 1) * stride + i] } else { 0 };
            let c = if y > 0 && i >= bpp {
                out[(y - 1) * stride + i - bpp]
            } else {
                0
            };
            let predicted = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                4 => paeth(a, b, c),
                f => anyhow::bail!("filter {f}"),
            };
            out[y * stride + i] = src[i].wrapping_add(predicted);
        }
    }
    Ok(out)
}

fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let p = i16::from(a) + i16::from(b) - i16::from(c);
    let (pa, pb, pc) = (
        (p - i16::from(a)).abs(),
        (p - i16::from(b)).abs(),
        (p - i16::from(c)).abs(),
    );
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    /// A 2×2 RGB PNG: rows filtered with Sub and Up, as an encoder would.
    fn tiny() -> Vec<u8> {
        // Pixels: (10,20,30) (20,30,40) / (10,20,30) (200,200,200)
        let raw = [1, 10, 20, 30, 10, 10, 10, 2, 0, 0, 0, 180, 170, 160];
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&raw).unwrap();
        let idat = z.finish().unwrap();
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut chunk = |kind: &[u8], body: &[u8]| {
            png.extend_from_slice(&(body.len() as u32).to_be_bytes());
            png.extend_from_slice(kind);
            png.extend_from_slice(body);
            png.extend_from_slice(&[0; 4]); // CRC: not checked
        };
        chunk(b"IHDR", &[0, 0, 0, 2, 0, 0, 0, 2, 8, 2, 0, 0, 0]);
        chunk(b"IDAT", &idat);
        chunk(b"IEND", &[]);
        png
    }

    #[test]
    fn decodes_filtered_rows() {
        let img = super::decode(&tiny()).unwrap();
        assert_eq!((img.width, img.height), (2, 2));
        assert_eq!(img.pixel(1, 0), [20, 30, 40]);
        assert_eq!(img.pixel(1, 1), [200, 200, 200]);
        assert!(img.variance(0, 0, 2, 2) > 100.0);
        assert_eq!(img.variance(0, 0, 1, 2), 0.0);
    }
}

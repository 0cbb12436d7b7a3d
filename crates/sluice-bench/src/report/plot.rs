//! Figure files: the font plotters draws text with, and drawing one figure
//! as both SVG and PNG (used by every report).
use anyhow::Result;
use plotters::style::FontStyle;

static FONT: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();

/// Plotters draws text with a TrueType font we give it (Debian's fonts-dejavu-core).
pub(crate) fn register_font() -> Result<()> {
    FONT.get_or_init(|| {
        let path = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e} (install fonts-dejavu-core: `make deps`)"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| "bad font".to_string())
    })
    .clone()
    .map_err(|e| anyhow::anyhow!(e))
}

/// Draw one figure as DIR/STEM.svg and DIR/STEM.png and give "STEM.svg":
/// `$draw` runs once with `$root` bound to each backend's drawing area (a
/// macro, as the drawing functions are generic over the backend).
macro_rules! svg_and_png {
    ($dir:expr, $stem:expr, $size:expr, |$root:ident| $draw:expr) => {{
        let (dir, stem): (&std::path::Path, &str) = ($dir, &$stem);
        let svg = dir.join(format!("{stem}.svg"));
        let $root = plotters::prelude::SVGBackend::new(&svg, $size).into_drawing_area();
        $draw?;
        let png = dir.join(format!("{stem}.png"));
        let $root = plotters::prelude::BitMapBackend::new(&png, $size).into_drawing_area();
        $draw?;
        format!("{stem}.svg")
    }};
}
pub(crate) use svg_and_png;

// Text geometry of the page as this browser lays it out: every text box (each line of an HTML
// text node, each SVG <text>) must overlap no other, lie inside the viewport's width, inside
// its picture and inside every ancestor that clips, no SVG text may touch a drawn shape (a
// line, an area, a bar) of its picture, and none may be drawn smaller than 9 pixels. Writes
// its findings as JSON into a <pre> with id "geometry-result" of the page that frames this one
// (or of this one), which `--dump-dom` prints.
(function () {
  const EPS = 0.5; // pixels of overlap forgiven: rounding of fractional layouts
  const MIN_PX = 9; // the smallest font size, in CSS pixels, that reads on a phone
  const problems = [];
  const boxes = [];
  const vw = window.innerWidth;
  const shown = (el) => el.getClientRects().length > 0;
  const short = (s) => {
    s = s.replace(/\s+/g, ' ').trim();
    return JSON.stringify(s.length > 60 ? s.slice(0, 57) + '…' : s);
  };
  const where = (el) => {
    const svg = el.closest('svg');
    if (svg) {
      const t = svg.querySelector(':scope > title');
      return 'picture ' + short(t ? t.textContent : 'untitled');
    }
    const section = el.closest('section');
    const h = section && section.querySelector('h2');
    return h ? 'section ' + short(h.textContent) : 'page';
  };
  const inside = (r, c) =>
    r.left >= c.left - EPS && r.right <= c.right + EPS &&
    r.top >= c.top - EPS && r.bottom <= c.bottom + EPS;
  const box = (r) => `[${r.left.toFixed(1)}, ${r.top.toFixed(1)}, ${r.right.toFixed(1)}, ${r.bottom.toFixed(1)}]`;

  // Ancestors that clip their content (overflow other than visible), up to the body.
  const clippers = (el) => {
    const out = [];
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== 'visible' || s.overflowY !== 'visible') out.push(a);
    }
    return out;
  };
  const checkCut = (name, el, r, container, containerName) => {
    if (r.left < -EPS || r.right > vw + EPS) {
      problems.push(`cut: ${name} ${box(r)} runs past the viewport's width ${vw}`);
    }
    if (container && !inside(r, container)) {
      problems.push(`cut: ${name} ${box(r)} is not inside ${containerName} ${box(container)}`);
    }
    for (const c of clippers(el)) {
      const cr = c.getBoundingClientRect();
      if (!inside(r, cr)) {
        problems.push(`cut: ${name} ${box(r)} is clipped by <${c.tagName.toLowerCase()}> ${box(cr)}`);
      }
    }
  };

  // SVG text, and the shapes of its picture.
  let svgs = 0;
  for (const svg of document.querySelectorAll('svg')) {
    if (!shown(svg)) continue;
    svgs++;
    const sr = svg.getBoundingClientRect();
    const size = svg.viewBox.baseVal;
    const shapes = [];
    for (const s of svg.querySelectorAll('line, polyline, polygon, path, rect, circle')) {
      if (s.closest('defs, pattern, title')) continue;
      const b = s.getBBox();
      // The background: a rectangle as large as the picture.
      if (s.tagName === 'rect' && b.width >= size.width && b.height >= size.height) continue;
      const st = getComputedStyle(s);
      shapes.push({ s, b, fill: st.fill !== 'none', stroke: st.stroke !== 'none' });
    }
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.width === 0) continue;
      const name = `${short(t.textContent)} (${where(t)})`;
      boxes.push({ name, r });
      checkCut(name, t, r, sr, 'its picture');
      // Readable: a picture scaled down to fit the screen shrinks its text with it.
      const tb = t.getBBox();
      const px = parseFloat(getComputedStyle(t).fontSize) * (r.height / tb.height);
      if (px < MIN_PX) {
        problems.push(`unreadable: ${name} is drawn ${px.toFixed(1)} pixels high (at least ${MIN_PX})`);
      }
      // Shapes under the text, in the picture's own units, the text's box shrunk by EPS.
      const x0 = tb.x + EPS, x1 = tb.x + tb.width - EPS;
      const y0 = tb.y + EPS, y1 = tb.y + tb.height - EPS;
      for (const { s, b, fill, stroke } of shapes) {
        const half = stroke ? (parseFloat(getComputedStyle(s).strokeWidth) || 1) / 2 : 0;
        if (b.x - half > x1 || b.x + b.width + half < x0 || b.y - half > y1 || b.y + b.height + half < y0) continue;
        let hit = s.tagName === 'rect' && fill;
        const p = svg.createSVGPoint();
        for (let x = x0; !hit && x <= x1; x += 1.5) {
          for (let y = y0; !hit && y <= y1; y += 1.5) {
            p.x = x; p.y = y;
            hit = (stroke && s.isPointInStroke(p)) || (fill && s.isPointInFill(p));
          }
        }
        if (hit) {
          problems.push(`crossed: ${name} is drawn over a <${s.tagName}> of its picture`);
        }
      }
    }
  }

  // HTML text: each line box of each text node.
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
    acceptNode: (n) =>
      n.textContent.trim() === '' || n.parentElement.closest('svg, script, style, #geometry-result')
        ? NodeFilter.FILTER_REJECT
        : NodeFilter.FILTER_ACCEPT,
  });
  const range = document.createRange();
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!shown(n.parentElement)) continue;
    range.selectNodeContents(n);
    const name = `${short(n.textContent)} (${where(n.parentElement)})`;
    for (const r of range.getClientRects()) {
      if (r.width === 0 || r.height === 0) continue;
      boxes.push({ name, r });
      checkCut(name, n.parentElement, r, null, null);
    }
  }

  // No two boxes overlap (two line boxes of one text node cannot: they are lines apart).
  for (let i = 0; i < boxes.length; i++) {
    const a = boxes[i].r;
    for (let j = i + 1; j < boxes.length; j++) {
      const b = boxes[j].r;
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > EPS && h > EPS) {
        problems.push(`overlap: ${boxes[i].name} ${box(a)} and ${boxes[j].name} ${box(b)}`);
      }
    }
  }
  const page = document.documentElement;
  if (page.scrollWidth > vw) {
    problems.push(`the page is ${page.scrollWidth} pixels wide in a viewport of ${vw}: it scrolls sideways`);
  }
  // Into the page that holds this one in a frame of the width checked, where there is one.
  const host = window.parent !== window ? window.parent.document : document;
  const out = host.createElement('pre');
  out.id = 'geometry-result';
  out.textContent = JSON.stringify({
    viewport: vw, height: page.scrollHeight, texts: boxes.length, pictures: svgs, problems,
  });
  host.body.appendChild(out);
})();

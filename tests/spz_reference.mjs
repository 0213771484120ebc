// Decode an .spz file with Niantic's own reader (@spz-loader/core: nianticlabs/spz's C++
// as WebAssembly) into RDF axes, and print it as JSON: node spz_reference.mjs DIR FILE,
// DIR holding node_modules/@spz-loader/core.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [moduleDir, file] = process.argv.slice(2);
// Its Emscripten build, bundled for browsers, fails on node's own path; its WebAssembly is
// embedded, so it runs as it would in a page.
process.type = "renderer";
const entry = `${moduleDir}/node_modules/@spz-loader/core/dist/index.js`;
const { loadSpz } = await import(pathToFileURL(entry).href);
// colorScaleFactor 1: the loader's colours are then the DC coefficients plus 0.5.
const cloud = await loadSpz(readFileSync(file),
                            { colorScaleFactor: 1, unpackOptions: { coordinateSystem: "RDF" } });
const out = { numPoints: cloud.numPoints, shDegree: cloud.shDegree,
              antialiased: cloud.antialiased };
for (const name of ["positions", "scales", "rotations", "alphas", "colors", "sh"]) {
  out[name] = Array.from(cloud[name]);
}
console.log(JSON.stringify(out));

// Validates custom resources against their CRDs' OpenAPI schemas, offline: the models of @kubernetes-models/*
// (npm) carry each CRD's schema as a compiled validator. Reads a JSON array of resources on stdin, prints a JSON
// array with one entry per resource: null when valid, else the error message.
import { readFileSync } from "node:fs";

const PACKAGES = {
  "gateway.networking.k8s.io": "@kubernetes-models/gateway-api",
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
};

async function check(resource) {
  const [group, version] = resource.apiVersion.split("/");
  const pkg = PACKAGES[group];
  if (!pkg) return `no schema for ${resource.apiVersion}`;
  const module = await import(`${pkg}/${group}/${version}/${resource.kind}`);
  try {
    new module[resource.kind](resource).validate();
    return null;
  } catch (error) {
    return String(error.message ?? error);
  }
}

const resources = JSON.parse(readFileSync(0, "utf8"));
console.log(JSON.stringify(await Promise.all(resources.map(check))));

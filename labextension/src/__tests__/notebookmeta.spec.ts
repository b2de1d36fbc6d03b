/** The pure parts of the notebook-metadata glue: which messages are records, the prime code. */

import { METADATA_MIME, primeCode, recordFromMessage } from '../notebookmeta';

const record = { version: 1, cluster: { num_cpus: 1, nodes: 2 } };

describe('recordFromMessage', () => {
  it('takes the record of a display_data of the nbcluster type', () => {
    const msg = { header: { msg_type: 'display_data' }, content: { data: { [METADATA_MIME]: record } } };
    expect(recordFromMessage(msg)).toEqual(record);
  });

  it('ignores everything else', () => {
    expect(recordFromMessage({ header: { msg_type: 'stream' }, content: { text: 'x' } })).toBeNull();
    const other = { header: { msg_type: 'display_data' }, content: { data: { 'text/plain': 'x' } } };
    expect(recordFromMessage(other)).toBeNull();
    const noVersion = { header: { msg_type: 'display_data' }, content: { data: { [METADATA_MIME]: {} } } };
    expect(recordFromMessage(noVersion)).toBeNull();
    const listed = { header: { msg_type: 'display_data' }, content: { data: { [METADATA_MIME]: [1] } } };
    expect(recordFromMessage(listed)).toBeNull();
  });
});

describe('primeCode', () => {
  it('sets the variable to base64 JSON and nothing else', () => {
    const hostile = { version: 1, cluster: {}, note: "'; import os; os.system('x') #\u00e9\u2028" };
    const code = primeCode(hostile);
    const m = /^__import__\('os'\)\.environ\['NBCLUSTER_NOTEBOOK_METADATA'\] = '([A-Za-z0-9+/=]+)'$/.exec(code);
    expect(m).not.toBeNull();
    const decoded = new TextDecoder().decode(Uint8Array.from(atob(m![1]), c => c.charCodeAt(0)));
    expect(JSON.parse(decoded)).toEqual(hostile);
  });
});

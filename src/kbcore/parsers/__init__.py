"""File formats beyond plain text: structure (headings, pages), office files, tables, archives.

:mod:`kbcore.parsing` dispatches to these modules; each is one family of formats. The office
formats need the optional extra ``pip install 'kbcore[office]'`` (python-docx, openpyxl,
python-pptx), imported only when such a file is parsed.
"""

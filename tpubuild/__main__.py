from tpubuild.entry import main

main()
